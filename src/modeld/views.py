"""Text views of command results (the JSON views are the data itself, see render.emit).

Each function takes the plain data a command produced and returns rich renderables.
"""

from __future__ import annotations

import time
from typing import Any

from modeld.render import fmt_bytes, fmt_duration, grid_table, key_value_table


def _yes(value: object) -> str:
    return "yes" if value else "no"


def show_view(data: dict[str, Any]) -> list[Any]:
    info: dict[str, Any] = data.get("info", {})
    layers = int(info.get("block_count") or 0)
    sliding = sum(1 for s in info.get("sliding_layers", []) if s)
    kv_heads = sorted(set(info.get("head_count_kv", [])))
    kv_text = ", ".join(str(k) for k in kv_heads) if kv_heads else "-"
    swa = f"{info.get('sliding_window')} tokens on {sliding} of {layers} layers" if sliding else "-"
    model_rows = [
        ("name", str(data.get("name", ""))),
        ("path", str(data.get("path", ""))),
        ("architecture", str(info.get("architecture", ""))),
        ("size label", str(info.get("size_label") or "-")),
        ("quantization", str(info.get("quantization") or "-")),
        ("file size", fmt_bytes(info.get("file_size"))),
        ("training context", str(info.get("context_length"))),
        ("layers", str(layers)),
        ("embedding", str(info.get("embedding_length"))),
        ("heads / KV heads", f"{info.get('head_count')} / {kv_text}"),
        ("key / value length", f"{info.get('key_length')} / {info.get('value_length')}"),
        ("sliding window", swa),
        ("vocabulary", str(info.get("vocab_size"))),
        ("chat template", _yes(info.get("has_chat_template"))),
        ("pooling", str(info.get("pooling_type") if info.get("pooling_type") is not None else "-")),
    ]
    for note in info.get("notes", []):
        model_rows.append(("note", str(note)))
    out: list[Any] = [key_value_table("Model", model_rows)]
    if not data.get("fits", False):
        err = data.get("error") or {}
        why = err.get("message") or data.get("plan_reason") or "does not fit the memory budget"
        out.append(key_value_table("Memory", [("fits", "no"), ("why", str(why))]))
        return out
    est: dict[str, Any] = data.get("estimate", {})
    mem_rows = [
        ("context (n_ctx)", f"{data.get('n_ctx')}  ({data.get('ctx_reason')})"),
        ("estimate", fmt_bytes(data.get("estimate_bytes"))),
    ]
    for part in ("weights_file", "weights_anon", "kv_cache", "compute", "output"):
        if part in est:
            mem_rows.append((f"  {part.replace('_', ' ')}", fmt_bytes(est[part])))
    mem_rows.append(("runner baseline", fmt_bytes(data.get("runner_baseline_bytes"))))
    if data.get("budget_bytes") is not None:
        mem_rows.append(("budget", fmt_bytes(data.get("budget_bytes"))))
    victims = data.get("would_evict") or []
    if victims:
        mem_rows.append(("would evict", ", ".join(str(v) for v in victims)))
    mem_rows.append(("source", str(data.get("source", "daemon"))))
    out.append(key_value_table("Memory", mem_rows))
    return out


def ps_view(data: dict[str, Any]) -> list[Any]:
    rows = []
    now = time.time()
    for m in data.get("models", []):
        measured = m.get("measured_bytes")
        mem = f"{fmt_bytes(measured)} / {fmt_bytes(m.get('estimate_bytes'))}"
        if m.get("pinned"):
            until = "pinned"
        elif m.get("forever"):
            until = "until memory is needed"
        else:
            until = fmt_duration(m.get("keep_alive_left_s"))
        last = m.get("last_used")
        ago = fmt_duration(now - float(last)) + " ago" if last else "-"
        rows.append(
            (
                str(m.get("name")),
                str(m.get("mode")),
                str(m.get("state")),
                mem,
                f"{m.get('n_ctx')} ({m.get('ctx_reason')})",
                f"{m.get('in_flight', 0)}/{m.get('queued', 0)}",
                until,
                ago,
            )
        )
    if not rows:
        return ["no models loaded"]
    headers = ("MODEL", "MODE", "STATE", "MEMORY (measured/est.)", "CONTEXT", "RUN/QUEUE")
    return [grid_table((*headers, "UNTIL", "LAST USED"), rows)]


def stats_view(data: dict[str, Any]) -> list[Any]:
    skip = {"schema_version", "kind"}
    rows = []
    for key, value in data.items():
        if key in skip:
            continue
        if key.endswith("_bytes") and isinstance(value, (int, float)):
            text = fmt_bytes(value)
        elif key.endswith("_s") and isinstance(value, (int, float)):
            text = f"{value:.2f}s" if value < 120 else fmt_duration(value)
        elif isinstance(value, float):
            text = f"{value:.3f}"
        else:
            text = str(value)
        rows.append((key.replace("_", " "), text))
    return [key_value_table("modeld stats", rows)]


def list_view(data: dict[str, Any]) -> list[Any]:
    rows = [
        (
            str(m.get("name")),
            fmt_bytes(m.get("size")),
            str(m.get("architecture") or "-"),
            str(m.get("quantization") or "-"),
            str(m.get("path")),
        )
        for m in data.get("models", [])
    ]
    if not rows:
        return [f"no models in {data.get('models_dir')} (put .gguf files there or add aliases)"]
    return [grid_table(("NAME", "SIZE", "ARCH", "QUANT", "PATH"), rows)]


def config_view(data: dict[str, Any]) -> list[Any]:
    sources: dict[str, str] = data.get("sources", {})
    settings: dict[str, Any] = data.get("settings", {})
    rows = [(name, str(value), sources.get(name, "")) for name, value in settings.items()]
    return [grid_table(("SETTING", "VALUE", "FROM"), rows)]

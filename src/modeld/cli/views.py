"""Text views of command results (the JSON views are the data itself, see render.emit).

Each function takes the plain data a command produced and returns rich renderables.
"""

from __future__ import annotations

import time
from typing import Any

from modeld.cli.pstable import compact_duration
from modeld.cli.render import fmt_bytes, grid_table, key_value_table


def _yes(value: object) -> str:
    return "yes" if value else "no"


_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank (a reranker)"}


def _pooling(value: object) -> str:
    if not isinstance(value, int):
        return "-"
    return _POOLING.get(value, str(value))


def rerank_view(data: dict[str, Any], documents: list[str]) -> list[Any]:
    """One row per scored document: its index in the input, its score, its text."""
    rows = []
    for r in data.get("results", []):
        i = int(r["index"])
        doc = documents[i] if 0 <= i < len(documents) else ""
        rows.append((str(i), f"{float(r['relevance_score']):.4f}", doc))
    return [grid_table(("INDEX", "SCORE", "DOCUMENT"), rows)]


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
        ("pooling", _pooling(info.get("pooling_type"))),
        ("mode", str(data.get("mode", "generate"))),
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
        ("parallel", f"{data.get('parallel', 1)}  ({data.get('parallel_reason') or '-'})"),
        ("KV layout", "one pool of n_ctx cells shared by the sequences" if data.get("kv_unified")
         else "n_ctx cells per sequence"),
        ("estimate", fmt_bytes(data.get("estimate_bytes"))),
    ]
    for part in ("weights_file", "weights_anon", "kv_cache", "compute", "output", "prompt_cache"):
        if part in est:
            mem_rows.append((f"  {part.replace('_', ' ')}", fmt_bytes(est[part])))
    mem_rows.append(("runner baseline", fmt_bytes(data.get("runner_baseline_bytes"))))
    if data.get("budget_bytes") is not None:
        mem_rows.append(("budget", fmt_bytes(data.get("budget_bytes"))))
    mem_rows += _placement_rows(data.get("placement"))
    if data.get("plan"):
        mem_rows.append(("plan", f"{data.get('plan')}: {data.get('plan_reason')}"))
    victims = data.get("evicts") or [{"name": v} for v in data.get("would_evict") or []]
    if victims:
        mem_rows.append(("would evict", "; ".join(_victim(v) for v in victims)))
    if data.get("backend"):
        mem_rows.append(("daemon backend", _backend(data)))
    mem_rows.append(("source", str(data.get("source", "daemon"))))
    out.append(key_value_table("Memory", mem_rows))
    return out


def _placement_rows(where: Any) -> list[tuple[str, str]]:
    """Where the layers go (show): backend, processor split, which layers where, VRAM."""
    if not isinstance(where, dict):
        return []
    layers = where.get("layers") or {}
    spans = ", ".join(f"{k} {v}" for k, v in layers.items()) if isinstance(layers, dict) else ""
    rows = [("backend", str(where.get("backend", "CPU"))),
            ("KV cache type", str(where.get("kv_cache_type", "f16"))),
            ("processor", f"{where.get('processor')}  ({where.get('reason')})")]
    if spans:
        rows.append(("layers", spans))
    for i, b in enumerate(where.get("vram_bytes") or []):
        rows.append((f"VRAM on CUDA{i}", fmt_bytes(b)))
    return rows


def _victim(v: dict[str, Any]) -> str:
    """``tiny (vram: frees 2.9 GiB of VRAM, 300 MiB of RAM)`` for the dry run."""
    why = v.get("reason")
    if why is None:
        return str(v.get("name"))
    vram = sum(int(b) for b in v.get("vram_bytes") or [])
    frees = (f"{fmt_bytes(vram)} of VRAM, " if vram else "") + f"{fmt_bytes(v.get('ram_bytes'))}"
    return f"{v.get('name')} ({why}: frees {frees} of RAM)"


def _backend(data: dict[str, Any]) -> str:
    """``CUDA: CUDA0 NVIDIA H100 (80 GiB, 60 GiB free)``: the backend and its devices."""
    parts = []
    for d in data.get("devices") or []:
        part = " ".join(str(d[k]) for k in ("name", "description") if d.get(k))
        if d.get("total_bytes"):
            part += (f" ({fmt_bytes(d['total_bytes'])}, {fmt_bytes(d.get('free_bytes'))} free,"
                     f" budget {fmt_bytes(d.get('budget_bytes'))}, models "
                     f"{fmt_bytes(d.get('used_bytes'))} meas/"
                     f"{fmt_bytes(d.get('estimate_bytes'))} est)")
        parts.append(part)
    return f"{data.get('backend')}" + (f": {'; '.join(parts)}" if parts else "")


def ps_view(data: dict[str, Any], verbose: bool = False) -> list[Any]:
    """``modeld ps`` (and ``load``) for people: :func:`pstable.text` at terminal width."""
    import shutil

    from modeld.cli import pstable

    width = shutil.get_terminal_size((80, 24)).columns
    return [pstable.text(list(data.get("models", [])), time.time(), width=width, verbose=verbose)]


def _label(key: str) -> str:
    for suffix in ("_bytes", "_s"):
        if key.endswith(suffix) and key != suffix:
            key = key[: -len(suffix)]
            break
    return key.replace("_", " ")


def _number(key: str, value: float) -> str:
    if key.endswith("_bytes"):
        return fmt_bytes(value)
    if key.endswith("_s"):
        return f"{value:.2f}s" if value < 120 else compact_duration(value)
    if key.endswith("_rate") or key.endswith("_fraction"):
        return f"{value * 100:.0f}%"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _stat_value(key: str, value: Any) -> str:
    """One stats value as text: dicts as ``a 1, b 2`` (non-zero only), lists summarised."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return _yes(value)
    if isinstance(value, (int, float)):
        return _number(key, value)
    if isinstance(value, dict):
        parts = [f"{k} {_stat_value(str(k), v)}" for k, v in value.items() if v not in (0, None)]
        return ", ".join(parts) if parts else "none"
    if isinstance(value, list):
        if not value:
            return "none"
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        if numbers and key.endswith("_bytes"):  # one per card
            return ", ".join(fmt_bytes(v) for v in value)
        if numbers:
            mean = sum(value) / len(value)
            return f"{len(value)} values, mean {mean:.3f}"
        if all(isinstance(v, dict) for v in value):
            return "; ".join(_named(v) for v in value)
        return ", ".join(str(v) for v in value)
    return str(value)


def _named(item: dict[str, Any]) -> str:
    """A dict from a stats list (e.g. a model cooling down after a failed load) in one line."""
    name = str(item.get("name", "?"))
    rest = [
        f"{_label(k)} {_stat_value(k, v)}" for k, v in item.items() if k not in ("name", "path")
    ]
    return f"{name} ({', '.join(rest)})" if rest else name


def stats_view(data: dict[str, Any]) -> list[Any]:
    """``modeld stats`` as one key/value table; estimate error samples become a mean."""
    skip = {"schema_version", "kind", "estimate_error_samples", "vram_estimate_error_samples"}
    rows = []
    for key, value in data.items():
        if key in skip:
            continue
        if key.endswith("estimate_error_mean") and value is not None:
            samples = data.get(key.replace("_mean", "_samples"))
            n = len(samples) if isinstance(samples, list) else 0
            rows.append((_label(key), f"{float(value) * 100:+.1f}% ({n} loads)"))
            continue
        if key.endswith("estimate_abs_error_mean") and value is not None:
            rows.append((_label(key), f"{float(value) * 100:.1f}%"))
            continue
        if key == "devices":
            rows.append(("backend", _backend(data)))
            continue
        if key == "backend":
            continue
        rows.append((_label(key), _stat_value(key, value)))
    return [key_value_table("modeld stats", rows)]


def list_view(data: dict[str, Any]) -> list[Any]:
    rows = [
        (
            f"{m.get('name')} ({m.get('target')})" if m.get("source") == "default" else
            str(m.get("hub_name") or m.get("name")),  # a pulled model: hf.co/ORG/REPO:QUANT
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

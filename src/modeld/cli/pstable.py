"""The ``modeld ps`` table as plain text: one implementation for the full CLI and the fast path.

Standard library only and no ``typing`` import, because :mod:`modeld.cli.entry` prints ``ps``
without loading Typer or rich and every millisecond of start-up counts there. The table fits an
80-column terminal for model names up to about 25 characters; beyond the terminal width only
the MODEL column folds. PROCESSOR (``ollama ps``'s: ``100% GPU``, ``35%/65% CPU/GPU``) is
shown when a model has layers on a GPU, with a line under the table per such model (its VRAM,
measured/planned, and its layers); on the CPU alone every row would say ``100% CPU``. Long
per-model facts (why this context, runner pid, path) go under the
table with ``--verbose``; ``--json`` always has everything.
"""

from __future__ import annotations

from modeld.cli.visible import visible

HEADERS = ("MODEL", "MODE", "STATE", "MEM meas/est", "CTX", "REQ", "UNTIL", "USED")
PROCESSOR_AT = 4  # the PROCESSOR column's place, when shown (after MEM, as in ollama ps)
MIN_NAME = 12  # the MODEL column folds long names down to this width, never less
GAP = "  "


def fmt_bytes(n: object) -> str:
    """Binary size with three significant digits (``5.2 MiB``, ``54.2 MiB``, ``418 MiB``)."""
    if not isinstance(n, (int, float)) or isinstance(n, bool):
        return "-"
    value, units = float(n), ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while abs(value) >= 999.5 and i < len(units) - 1:  # 999.5 would print as "1000"
        value /= 1024
        i += 1
    unit = units[i]
    return f"{value:.0f} {unit}" if unit == "B" or abs(value) >= 100 else f"{value:.1f} {unit}"


def mem_pair(measured: object, estimate: object) -> str:
    """``54.2/58.6 MiB``: measured and estimated bytes, the unit once when they share it."""
    a, b = fmt_bytes(measured), fmt_bytes(estimate)
    a_num, _, a_unit = a.partition(" ")
    b_num, _, b_unit = b.partition(" ")
    if a_unit and a_unit == b_unit:
        return f"{a_num}/{b_num} {a_unit}"
    return f"{a}/{b}"


def compact_duration(seconds: float) -> str:
    """``45s``, ``4m59s``, ``2h05m``: durations without spaces for narrow columns."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def ago(seconds: float) -> str:
    """Coarse age for the USED column: ``12s ago``, ``4m ago``, ``2h ago``, ``3d ago``."""
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit} ago"
    return f"{s}s ago"


def until(m: dict[str, object]) -> str:
    """When the model unloads: ``pinned``, ``forever`` (until memory is needed), or a time."""
    if m.get("pinned"):
        return "pinned"
    if m.get("forever"):
        return "forever"
    left = m.get("keep_alive_left_s")
    if not isinstance(left, (int, float)):
        return "-"  # busy or loading: the clock starts when the last request ends
    return compact_duration(float(left))


def ctx_cell(n_ctx: object, parallel: object, unified: object = False) -> str:
    """``8192``, ``2048x4`` for four sequences of 2048 tokens each, or ``8192 shared by 4``
    for four sequences sharing one pool of 8192 cells (kv_unified)."""
    if n_ctx is None:
        return "-"
    if not isinstance(parallel, int) or parallel <= 1:
        return str(n_ctx)
    return f"{n_ctx} shared by {parallel}" if unified is True else f"{n_ctx}x{parallel}"


def on_gpu(models: list[dict[str, object]]) -> bool:
    """Whether any model has layers on a GPU (then ``ps`` shows PROCESSOR)."""
    return any(m.get("processor") not in (None, "100% CPU") for m in models)


def rows(
    models: list[dict[str, object]], now: float, processor: bool = False
) -> list[tuple[str, ...]]:
    """The table cells; CTX is n_ctx, ``x N`` when N sequences of it decode together
    (``parallel``; ``shared by N`` when they share one pool of it: ``kv_unified``), REQ
    active (decoding) / queued requests, MODE ``gen`` or ``embed``; ``processor``: with the
    PROCESSOR cell."""
    out: list[tuple[str, ...]] = []
    for m in models:
        last = m.get("last_used")
        mode = str(m.get("mode"))
        n_ctx = m.get("n_ctx")
        out.append(
            (
                str(m.get("name")),
                "gen" if mode == "generate" else mode,
                str(m.get("state")),
                mem_pair(m.get("measured_bytes"), m.get("estimate_bytes")),
                ctx_cell(n_ctx, m.get("parallel"), m.get("kv_unified")),
                f"{m.get('in_flight', 0)}/{m.get('queued', 0)}",
                until(m),
                ago(now - float(last)) if isinstance(last, (int, float)) else "-",
            )
        )
        if processor:
            cells = out[-1]
            out[-1] = (*cells[:PROCESSOR_AT], str(m.get("processor") or "-"),
                       *cells[PROCESSOR_AT:])  # fmt: skip
    return out


def details(m: dict[str, object]) -> list[tuple[str, str]]:
    """The long per-model facts printed under the table with ``--verbose``."""
    load_s = m.get("load_seconds")
    keep = m.get("keep_alive_s")
    items = [
        ("context", m.get("ctx_reason")),
        ("parallel", m.get("parallel_reason")),
        ("path", m.get("path")),
        ("runner pid", m.get("runner_pid")),
        ("load time", f"{load_s:.2f}s" if isinstance(load_s, (int, float)) else None),
        ("uses", m.get("use_count")),
        ("keep-alive", f"{keep:g}s" if isinstance(keep, (int, float)) else None),
        ("retiring", m.get("retiring")),
        ("last unload", m.get("last_unload_reason")),
    ]
    return [(label, str(value)) for label, value in items if value is not None]


def _line(cells: tuple[str, ...], widths: list[int]) -> str:
    return GAP.join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def text(
    models: list[dict[str, object]], now: float, width: int = 80, verbose: bool = False
) -> str:
    """The whole ``ps`` output, at most ``width`` columns unless names cannot fold further."""
    gpu = on_gpu(models)
    cells = [tuple(visible(c) for c in row) for row in rows(models, now, gpu)]
    if not cells:
        return "no models loaded\n"
    headers = HEADERS if not gpu else (*HEADERS[:PROCESSOR_AT], "PROCESSOR",
                                       *HEADERS[PROCESSOR_AT:])  # fmt: skip
    widths = [max(len(r[i]) for r in (headers, *cells)) for i in range(len(headers))]
    excess = sum(widths) + len(GAP) * (len(widths) - 1) - width
    if excess > 0:
        widths[0] = max(MIN_NAME, widths[0] - excess)
    lines = [_line(headers, widths), GAP.join("─" * w for w in widths)]
    for row in cells:
        name = row[0]
        lines.append(_line((name[: widths[0]], *row[1:]), widths))
        lines.extend(name[i : i + widths[0]] for i in range(widths[0], len(name), widths[0]))
    lines += [line for m in models if (line := devices_line(m) or gpu_line(m))]
    if verbose:
        for m in models:
            lines += ["", visible(f"{m.get('name')} ({m.get('mode')}):")]
            lines += [f"  {label}: {value}" for label, value in details(m)]
    return "\n".join(lines) + "\n"


def devices_line(model: dict[str, object]) -> str:
    """For a model on RPC workers: where llama.cpp put it (weights + KV per device)."""
    devices = model.get("devices")
    if not isinstance(devices, list) or not devices:
        return ""
    parts = []
    for d in devices:
        if not isinstance(d, dict):
            continue
        where = f"{d.get('device')} {d.get('endpoint')}" if d.get("endpoint") else d.get("device")
        part = f"{where}: weights {_mib(d.get('model_bytes'))}, KV {_mib(d.get('kv_bytes'))}"
        planned = [d.get(k) for k in ("planned_model_bytes", "planned_kv_bytes",
                                      "planned_compute_bytes")]  # fmt: skip
        if all(isinstance(v, int) for v in planned):
            total = sum(int(v) for v in planned if isinstance(v, int))
            part += f" (planned with compute {_mib(total)} of {_mib(d.get('plan_memory_bytes'))})"
        parts.append(part)
    layers = model.get("layers_offloaded")
    tail = f" (layers on workers {layers})" if layers else ""
    return f"{model.get('name')} on rpc workers{tail}: " + "; ".join(parts)


def gpu_line(model: dict[str, object]) -> str:
    """For a model with layers on a GPU: its VRAM (NVML's bytes of its runner / the plan) and
    its layers there: ``tiny on GPU: VRAM 2.9/3.1 GiB, 23/23 layers (every layer fits …)``."""
    layers = model.get("gpu_layers")
    if not isinstance(layers, int) or layers <= 0:
        return ""
    where = model.get("layers")
    spans = ", ".join(f"{k} {v}" for k, v in where.items()) if isinstance(where, dict) else ""
    vram = mem_pair(model.get("vram_measured"), model.get("vram_estimate"))
    line = (f"{model.get('name')} on GPU: VRAM {vram} meas/est, {layers}/"
            f"{model.get('n_layers', '?')} layers" + (f" ({spans})" if spans else ""))
    return line + (f" ({model.get('gpu_reason')})" if model.get("gpu_reason") else "")


def _mib(value: object) -> str:
    return f"{int(value) / 2**20:.1f} MiB" if isinstance(value, int) else "?"

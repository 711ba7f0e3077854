"""Report sections of the issue-26 memory and CLI-floor benchmarks (report.py renders the
rest; split off to keep each module short)."""

from __future__ import annotations

from typing import Any

MiB = 1 << 20


def _mib(x: Any) -> str:
    return "-" if x is None else f"{x / MiB:.1f}"


def tree_memory(doc: dict[str, Any]) -> list[str]:
    rows = [f"Models: {', '.join(doc.get('models', []))}; n_ctx {doc.get('n_ctx')} per sequence, "
            f"parallel {doc.get('parallel')} on both sides; "
            f"{doc.get('requests_per_model')} requests per model.", "",
            "| side | process | RSS MiB | PSS MiB | anonymous MiB |", "|---|---|---:|---:|---:|"]
    for side in ("modeld", "modeld_no_spare", "router"):
        part = doc.get(side)
        if not part:
            continue
        label = {"modeld_no_spare": "modeld, spare_runner false"}.get(side, side)
        for p in part["processes"]:
            role = p["role"] if not p["role"].startswith("server: ") else "llama-server child"
            rows.append(f"| {label} | {role} | {_mib(p['rss'])} | {_mib(p['pss'])} | "
                        f"{_mib(p['anon'])} |")
        t = part["total"]
        rows.append(f"| {label} | **total** | **{_mib(t['rss'])}** | **{_mib(t['pss'])}** | "
                    f"{_mib(t['anon'])} |")
    rows += ["", f"Ratios to the router: PSS {doc.get('ratio_pss', 0):.3f}, RSS "
             f"{doc.get('ratio_rss', 0):.3f}; without the spare runner PSS "
             f"{doc.get('ratio_pss_no_spare', 0):.3f}, RSS {doc.get('ratio_rss_no_spare', 0):.3f}."]
    return rows


def cli_floor(doc: dict[str, Any]) -> list[str]:
    med = doc.get("median_s", {})
    rows = ["| command | median |", "|---|---:|"]
    rows += [f"| `{k}` | {v * 1000:.1f} ms |" for k, v in med.items()]
    rows += ["", f"{doc.get('rounds')} interleaved rounds. `modeld ps` / `python -c pass` "
             f"{doc.get('ratio_ps_to_python', 0):.2f}; warm 1-token `modeld run` / curl "
             f"{doc.get('ratio_run_to_curl', 0):.2f}."]
    return rows

"""$OUT/gpu.json from $OUT/gpu.jsonl (bench/gpu_bench.py's rows): the rows and the targets of
issues 34 and 44, error rows kept as rows (they meet no target). ``gpu_bench.py summary``."""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Any

OUT = os.environ.get("OUT", "/tmp/out")
LOG = os.path.join(OUT, "gpu.jsonl")


def _median_wall(rows: list[dict[str, Any]]) -> float | None:
    walls = [t["wall_s"] for r in rows for t in r.get("ttft", [])]
    return statistics.median(walls) if walls else None


def summary() -> dict[str, Any]:
    """$OUT/gpu.json from gpu.jsonl: the rows and the issue's targets (error rows are kept
    as rows and meet no target)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from harness import target

    with open(LOG) as f:
        recs = [json.loads(line) for line in f if line.strip()]

    def ok(kind: str) -> list[dict[str, Any]]:
        return [r for r in recs if r.get("kind") == kind and "error" not in r]

    vram = []
    for m in ok("vram_measured"):
        est = next(
            (
                e
                for e in ok("vram_estimate")
                if (e["n_ctx"], e["n_seq"]) == (m["n_ctx"], m["n_seq"])
            ),
            {},
        )
        if est.get("vram") and m.get("nvml_process"):
            vram.append(
                {
                    "n_ctx": m["n_ctx"],
                    "n_seq": m["n_seq"],
                    "nvml": m["nvml_process"],
                    "estimate": est["vram"],
                    "error": (est["vram"] - m["nvml_process"]) / m["nvml_process"],
                }
            )
    server = {(r["np"], r["ngl"]): r for r in ok("server")}
    ours = {(r["clients"], r["gpu_layers"]): r for r in ok("modeld")}
    cold = next(iter(ok("modeld_cold_load")), {})
    targets = [
        target(
            f"VRAM estimate error, n_ctx {v['n_ctx']} x {v['n_seq']}", abs(v["error"]), 0.05, "<="
        )
        for v in vram
    ]

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    for n in (1, 4, 8):
        if (n, 99) in server and (n, -1) in ours:
            targets.append(
                target(
                    f"{n} client(s): modeld / llama-server -np {n} (tok/s)",
                    ratio(ours[n, -1]["aggregate_tok_s"], server[n, 99]["aggregate_tok_s"]),
                    0.95 if n == 1 else 1.0,
                    ">=",
                )
            )
    if cold.get("wall_s") and (1, 99) in server:
        targets.append(
            target(
                "cold load: modeld load / llama-server start to ready",
                ratio(cold["wall_s"], server[1, 99]["ready_s"]),
                1.1,
                "<=",
            )
        )
    ttft_ours, ttft_server = (
        _median_wall(ok("modeld_ttft")),
        _median_wall([server.get((1, 99), {})]),
    )
    if ttft_ours is not None and ttft_server is not None:
        targets.append(
            target(
                "first token of the long prompt: modeld / llama-server",
                ratio(ttft_ours, ttft_server),
                1.1,
                "<=",
            )
        )
    part_s = [v for (n, ngl), v in server.items() if n == 1 and ngl != 99]
    part_o = [v for (n, ngl), v in ours.items() if n == 1 and ngl != -1]
    if part_s and part_o:
        targets.append(
            target(
                f"half the layers on the card (-ngl {part_s[0]['ngl']}): modeld / llama-server",
                ratio(part_o[0]["aggregate_tok_s"], part_s[0]["aggregate_tok_s"]),
                0.9,
                ">=",
            )
        )
    probe = next(iter(ok("probe")), {})
    card = (probe.get("gpus") or [{}])[0]
    doc = {
        "benchmark": "gpu",
        "title": "On an NVIDIA card (issues 34, 44)",
        "what": "a TinyLlama-1.1B-shaped f16 model (2.2 GB, generated), every layer on the "
        "card unless said; VRAM per process (NVML) vs modeld's estimate; decode of llama-server "
        "-ngl 99 -fa on (-np 1/4/8) vs the modeld daemon (parallel 1/4/8), greedy tokens per "
        "client; cold load; first token of a ~3,000-token prompt; half the layers offloaded",
        "card": card.get("name"),
        "cpu_check": bool(probe.get("cpu")),
        "vram": vram,
        "server": list(server.values()),
        "modeld": list(ours.values()),
        "cold_load": cold,
        "ttft": {"modeld_s": ttft_ours, "server_s": ttft_server},
        "errors": [r for r in recs if "error" in r or r.get("kind") == "child_failed"],
        "targets": targets,
    }
    with open(os.path.join(OUT, "gpu.json"), "w") as f:
        json.dump(doc, f, indent=2)
    for t in targets:
        value = "n/a" if t["value"] is None else f"{t['value']:.3f}"
        print(f"{'MET ' if t['met'] else 'MISS'} {t['name']}: {value} ({t['op']} {t['limit']})")
    print(f"rows with errors: {len(doc['errors'])}")
    return doc

"""CLI start-up and memory footprint benchmarks (7 and 6).

CLI start-up is the latency of every shell call, so ``modeld ps`` and ``modeld --help`` are
compared with ``python -c pass`` (the floor for any Python CLI), interleaved. The full Typer
path (``MODELD_NO_FAST=1``) and the pyzmq transport are measured alongside as context, and
``python -X importtime`` profiles say where the time goes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from harness import (
    BIN,
    PY,
    ROOT,
    Context,
    Daemon,
    MiB,
    interleave,
    run_timed,
    smaps_rollup,
    summary,
    target,
)


def importtime(code: str, env: dict[str, str] | None = None, top: int = 12) -> dict[str, Any]:
    """Total and the largest cumulative entries of ``python -X importtime -c code``."""
    proc = subprocess.run([PY, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          env=env, check=False)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) == 3:
            rows.append((int(parts[0]), int(parts[1]), parts[2].rstrip()))
    top_level = [r for r in rows if not r[2].startswith("  ")]
    biggest = sorted(rows, key=lambda r: -r[1])[:top]
    return {
        "code": code,
        "total_ms": round(sum(r[1] for r in top_level) / 1000, 1),
        "top_cumulative_ms": [
            {"module": m.strip(), "ms": round(c / 1000, 1)} for _, c, m in biggest
        ],
    }


def cli_startup(ctx: Context, d: Daemon) -> dict[str, Any]:
    """``modeld ps`` (daemon running) and ``modeld --help`` vs ``python -c pass``."""
    modeld = str(BIN / "modeld")
    env = dict(d.env)
    env.pop("COLUMNS", None)
    full = dict(env, MODELD_NO_FAST="1")
    pyzmq = dict(env, MODELD_FAST_TRANSPORT="pyzmq")
    outputs: dict[str, str] = {}

    def timed(cmd: list[str], e: dict[str, str], name: str) -> Any:
        def go() -> float:
            dt, proc = run_timed(cmd, env=e)
            outputs[name] = proc.stdout.decode(errors="replace")[:2000]
            return dt

        return go

    alternatives = {
        "python -c pass": timed([PY, "-c", "pass"], env, "pass"),
        "modeld ps": timed([modeld, "ps"], env, "ps"),
        "modeld --help": timed([modeld, "--help"], env, "help"),
        "modeld ps (pyzmq transport)": timed([modeld, "ps"], pyzmq, "ps_pyzmq"),
        "modeld ps (full Typer CLI)": timed([modeld, "ps"], full, "ps_full"),
        "modeld --help (full Typer CLI)": timed([modeld, "--help"], full, "help_full"),
    }
    rounds = max(ctx.rounds, 10) if not ctx.smoke else ctx.rounds
    samples = interleave(alternatives, rounds * 2)
    med = {k: summary(v)["median"] for k, v in samples.items()}
    base = med["python -c pass"]
    ratios = {k: (v / base if v and base else None) for k, v in med.items()}
    profiles = [
        importtime("import modeld.cli.app"),
        importtime("import zmq"),
        importtime("import typer"),
        importtime("import modeld.config"),
        # the ps fast path
        importtime("import modeld.cli.entry, modeld.cli.pstable, ctypes, _json"),
    ]
    return {
        "title": "CLI start-up",
        "what": "wall time of each command as a subprocess (the daemon running, one model "
        "loaded) vs `python -c pass`, interleaved",
        "median_s": med,
        "ratio_to_python": ratios,
        "stats_s": {k: summary(v) for k, v in samples.items()},
        "help_identical_to_typer": outputs.get("help") == outputs.get("help_full"),
        "importtime": profiles,
        "outputs": {k: outputs.get(k, "") for k in ("ps", "ps_full")},
        "targets": [
            target("modeld ps / python -c pass", ratios["modeld ps"], 2.5, "<="),
            target("modeld --help / python -c pass", ratios["modeld --help"], 2.5, "<="),
        ],
    }


def _after_load(models: list[Path]) -> list[dict[str, Any]]:
    """Estimate vs measured right after loading each model, in a fresh daemon."""
    from harness import daemon

    out = []
    with daemon(spare=False) as fresh:
        c = fresh.client()
        for m in models:
            row = c.load(str(m))
            row = row.get("model", row) if isinstance(row.get("model"), dict) else row
            est, meas = row.get("estimate_bytes"), row.get("measured_bytes")
            out.append({"model": row["name"], "n_ctx": row["n_ctx"], "estimate_bytes": est,
                        "measured_bytes": meas,
                        "error": (est - meas) / meas if est and meas else None})
    return out


def footprint(ctx: Context, d: Daemon, idle_start: dict[str, int], models: list[Path],
              calibration: Path | None = None) -> dict[str, Any]:
    """Idle daemon RSS, runner baseline, and estimate-vs-measured error per loaded model."""
    c = d.client()
    stats = c.stats()
    rows = [r for r in c.ps() if r["state"] == "ready"]
    loaded = []
    for r in rows:
        est, meas = r.get("estimate_bytes"), r.get("measured_bytes")
        pid = r.get("runner_pid")
        direct = smaps_rollup(int(pid)) if pid else None
        loaded.append({
            "model": r["name"],
            "n_ctx": r["n_ctx"],
            "estimate_bytes": est,
            "measured_bytes": meas,
            "error": (est - meas) / meas if est and meas else None,
            "runner_smaps": direct,
        })
    spare = [p for p in d.runners() if p not in {r.get("runner_pid") for r in rows}]
    spare_rss = smaps_rollup(spare[0]) if spare else None
    c.unload(all=True)
    import time

    time.sleep(0.5)
    idle_after = smaps_rollup(d.pid)
    cal_rows = []
    cal_path = calibration or ROOT / "bench" / "results" / "calibration.json"
    if cal_path.exists():
        cal = json.loads(cal_path.read_text())
        for case in cal.get("cases", []):
            cal_rows.append({"model": case["model"], "n_ctx": case["n_ctx"],
                             "measured_bytes": case["measured"]["rss"],
                             "estimate_bytes": case["estimate"]["total"],
                             "error": case["error"]})
    after_load = _after_load(models)
    worst = max((abs(x["error"]) for x in after_load if x["error"] is not None), default=None)
    return {
        "title": "Footprint",
        "what": "daemon RSS from /proc/<pid>/smaps_rollup while idle (spare runner up, no "
        "model) at start and after the workload; runner baseline as `modeld stats` reports "
        "it and as measured on the spare runner; estimate vs measured per loaded model",
        "daemon_idle_start": idle_start,
        "daemon_idle_after": idle_after,
        "daemon_idle_start_mib": idle_start["rss"] / MiB,
        "daemon_idle_after_mib": idle_after["rss"] / MiB,
        "runner_baseline_bytes": stats.get("runner_baseline_bytes"),
        "spare_runner_smaps": spare_rss,
        "estimate_error_mean": stats.get("estimate_error_mean"),
        "after_load": after_load,
        "worst_abs_error_after_load": worst,
        "loaded": loaded,
        "calibration": cal_rows,
        "targets": [
            target("idle daemon RSS MiB (start)", idle_start["rss"] / MiB, 60, "<="),
            target("idle daemon RSS MiB (after use)", idle_after["rss"] / MiB, 60, "<="),
            target("runner baseline counted (stats)", 1.0 if stats.get("runner_baseline_bytes")
                   else 0.0, 1.0, ">="),
        ],
    }


def cli_floor(ctx: Context) -> dict[str, Any]:
    """Issue 26's CLI floor, one daemon with the HTTP front door and the default model warm,
    all four interleaved (A B C D, D C B A): `python -c pass`, `modeld ps`, a warm 1-token
    `modeld run --max-tokens 1 default "Hi"` and `curl` asking the front door the same
    (`/api/generate`, `num_predict` 1, not streamed): the CLI against the floor of any Python
    program and against the cheapest client of the same daemon."""
    import shutil

    from harness import daemon, free_port

    curl = shutil.which("curl")
    port = free_port()
    # the command names the built-in default model (ctx.model is that file; a smoke run
    # names a generated one); curl names the file, the same loaded model
    model = str(ctx.model)
    cli_model = model if ctx.smoke else "default"
    with daemon(env={"MODELD_HTTP": f"127.0.0.1:{port}"}) as d:
        d.client().load(model if ctx.smoke else None)
        env = dict(d.env)
        env.pop("COLUMNS", None)
        modeld = str(BIN / "modeld")
        body = json.dumps({"model": model, "prompt": "Hi", "stream": False,
                           "options": {"num_predict": 1}})  # fmt: skip
        alternatives: dict[str, Any] = {
            "python -c pass": lambda: run_timed([PY, "-c", "pass"], env=env)[0],
            "modeld ps": lambda: run_timed([modeld, "ps"], env=env)[0],
            "modeld run --max-tokens 1": lambda: run_timed(
                [modeld, "run", "--max-tokens", "1", cli_model, "Hi"], env=env)[0],
        }
        if curl:
            alternatives["curl /api/generate"] = lambda: run_timed(
                [curl, "-sS", "--fail", "-o", "/dev/null", "-H", "Content-Type: application/json",
                 "-d", body, f"http://127.0.0.1:{port}/api/generate"], env=env)[0]
        for alt in alternatives.values():  # warm: page cache, bytecode, the prompt's snapshot
            alt()
        rounds = max(ctx.rounds * 2, 20) if not ctx.smoke else 2
        samples = interleave(alternatives, rounds)
    med = {k: summary(v)["median"] for k, v in samples.items()}
    out: dict[str, Any] = {
        "title": "CLI floor (issue 26)",
        "what": " ".join((cli_floor.__doc__ or "").split()),
        "median_s": med,
        "stats_s": {k: summary(v) for k, v in samples.items()},
        "rounds": rounds,
        "ratio_ps_to_python": med["modeld ps"] / med["python -c pass"],
        "targets": [target("modeld ps / python -c pass (same run)",
                           med["modeld ps"] / med["python -c pass"], 2.0, "<=")],
    }
    if curl:
        out["ratio_run_to_curl"] = med["modeld run --max-tokens 1"] / med["curl /api/generate"]
        out["targets"].append(target("warm 1-token modeld run / curl to the front door",
                                     out["ratio_run_to_curl"], 2.0, "<="))
    return out

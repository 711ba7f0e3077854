"""Run the benchmark suite and write bench/results/*.json and docs/benchmarks.md.

    .venv/bin/python bench/run.py                 # everything (about 20-25 minutes on 2 cores)
    .venv/bin/python bench/run.py --rounds 3      # quicker, noisier
    .venv/bin/python bench/run.py --only cli,trace
    .venv/bin/python bench/run.py --smoke --out /tmp/x   # tiny models, one round (the test)

scripts/bench.sh sets up the environment and calls this. Benchmarks: cold_load, warm_call,
streaming, prefix_reuse, cli_startup, concurrency, footprint (one daemon), trace (its own),
http_api, parallel and parallel_sampled (their own daemons, and llama.cpp's llama-server router
from bench/peer.py),
pull (modeld pull against curl from a loopback fake hub), rpc (a model on llama.cpp RPC workers).
agent_turns (its own daemon: a Claude-Code-shaped conversation over /v1/messages),
agent_session (its own daemons: a 10-turn session that outgrows its context),
agent_session_peer (a shorter session: modeld vs llama-server --jinja, bench/peer.py),
agent_branches (its own daemons: appended turns, a branch back and a compaction),
kv_cache_type (its own daemon: f16/q8_0/q4_0, estimate vs measured),
kv_unified (its own daemons: one KV pool shared by 4 sequences vs a stream each),
vision (its own daemon beside llama-server --mmproj: a 1-image question, the repeated image).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
from harness import RESULTS, Context, daemon, loadavg, smaps_rollup, write_result

DAEMON_BENCHES = ("cold_load", "warm_call", "streaming", "prefix_reuse", "cli_startup",
                  "concurrency", "footprint")  # fmt: skip
ALL = (*DAEMON_BENCHES, "trace", "http_api", "structured", "agent_turns", "agent_session",
       "agent_session_peer", "agent_branches", "kv_cache_type", "kv_unified", "parallel",
       "parallel_sampled", "tree_memory", "cli_floor", "pull", "rpc", "heavy", "vision")
GROUPS = {"cli": ("cli_startup",), "daemon": DAEMON_BENCHES}


def _selected(only: str | None) -> list[str]:
    if not only:
        return list(ALL)
    out: list[str] = []
    for name in only.split(","):
        out.extend(GROUPS.get(name.strip(), (name.strip(),)))
    unknown = [n for n in out if n not in ALL]
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(ALL)}")
    return [n for n in ALL if n in out]


def _record(ctx: Context, name: str, fn: Any, *args: Any, **kwargs: Any) -> None:
    """Run one benchmark and write its result (an error is written as a result too)."""
    started, load0 = time.monotonic(), loadavg()
    ctx.log(f"== {name} (load average {load0})")
    try:
        data = fn(ctx, *args, **kwargs)
    except Exception as exc:
        traceback.print_exc()
        data = {"title": name, "error": f"{type(exc).__name__}: {exc}", "targets": []}
    path = write_result(ctx, name, data, started, load0)
    for t in data.get("targets", []):
        value = t["value"]
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        mark = "MET " if t["met"] else "MISS"
        ctx.log(f"   {mark} {t['name']}: {shown} ({t['op']} {t['limit']})")
    ctx.log(f"   -> {path}")


def run(ctx: Context, names: list[str], trace_n: int) -> None:
    import b_cli
    import b_conc
    import b_daemon
    import b_parallel
    import b_trace

    wanted = [n for n in names if n in DAEMON_BENCHES]
    if wanted:
        second = harness.tiny(seed=1) if ctx.smoke else harness.generated(
            "llama", **b_trace.TRACE_MODEL, seed=101)
        # Default threads (the usable CPUs, shared among runners generating at once); the
        # in-process baselines use the same count (ctx.threads).
        with daemon() as d:
            time.sleep(0.3)
            idle_start = smaps_rollup(d.pid)
            funcs = {
                "cold_load": (b_daemon.cold_load, ()),
                "warm_call": (b_daemon.warm_call, ()),
                "streaming": (b_daemon.streaming, ()),
                "prefix_reuse": (b_daemon.prefix_reuse, ()),
                "cli_startup": (b_cli.cli_startup, ()),
                "concurrency": (b_conc.concurrency, ([ctx.model, second],)),
                "footprint": (b_cli.footprint, (idle_start, [ctx.model, second])),
            }
            for name in wanted:
                fn, extra = funcs[name]
                if name == "prefix_reuse" and ctx.smoke:
                    _record(ctx, name, fn, d, *extra, prefix_tokens=200)
                else:
                    _record(ctx, name, fn, d, *extra)
    if "http_api" in names and not ctx.smoke:  # needs llama-server built (bench/peer.py)
        import b_http

        _record(ctx, "http_api", b_http.http_api)
    if "structured" in names and not ctx.smoke:  # beside llama-server --jinja (bench/peer.py)
        import b_structured

        _record(ctx, "structured", b_structured.structured)
    if "agent_turns" in names:  # its own daemon, with the HTTP front door
        import b_agent

        _record(ctx, "agent_turns", b_agent.agent_turns)
    if "agent_session" in names:  # its own daemons, with the HTTP front door
        import b_session

        _record(ctx, "agent_session", b_session.agent_session)
    if "agent_session_peer" in names and not ctx.smoke:  # beside llama-server (bench/peer.py)
        import b_session

        _record(ctx, "agent_session_peer", b_session.agent_session_peer)
    if "agent_branches" in names:  # its own daemons, with the HTTP front door
        import b_branches

        _record(ctx, "agent_branches", b_branches.agent_branches)
    if "kv_cache_type" in names:  # its own daemon, the prompt cache off
        import b_kvtype

        _record(ctx, "kv_cache_type", b_kvtype.kv_cache_type)
    if "kv_unified" in names:  # its own daemons, the prompt cache off
        import b_kvunified

        _record(ctx, "kv_unified", b_kvunified.kv_unified)
    if "trace" in names:
        if ctx.smoke:
            _record(ctx, "trace", b_trace.trace_bench, n=trace_n, subset_a=2, load_seeds=2)
        else:
            _record(ctx, "trace", b_trace.trace_bench, n=trace_n)
    if "parallel" in names:  # its own daemons beside llama-server (bench/peer.py builds it)
        _record(ctx, "parallel", b_parallel.parallel_bench)
    if "parallel_sampled" in names:  # the same, temperature 0.7, 8 clients
        _record(ctx, "parallel_sampled", b_parallel.parallel_sampled_bench)
    if "cli_floor" in names:  # its own daemon, with the HTTP front door
        _record(ctx, "cli_floor", b_cli.cli_floor)
    if "tree_memory" in names:  # its own daemon beside llama-server (bench/peer.py builds it)
        import b_tree

        _record(ctx, "tree_memory", b_tree.tree_memory_bench)
    if "heavy" in names and not ctx.smoke:  # its own daemon with HTTP, --parallel 2
        import b_heavy

        _record(ctx, "heavy", b_heavy.heavy)
    if "pull" in names:  # no daemon: modeld pull and curl against a loopback fake hub
        import b_pull

        _record(ctx, "pull", b_pull.pull_bench)
    if "vision" in names:  # its own daemon beside llama-server --mmproj (bench/peer.py)
        import b_vision

        _record(ctx, "vision", b_vision.vision)
    if "rpc" in names:  # its own daemon and `modeld rpc-worker` processes on loopback
        import b_rpc

        _record(ctx, "rpc", b_rpc.rpc_bench)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny generated models, one round")
    ap.add_argument("--rounds", type=int, help="rounds per comparison (default 10; smoke 1)")
    ap.add_argument("--out", type=Path, help=f"results directory (default {RESULTS})")
    ap.add_argument("--only", help=f"comma-separated subset of: {', '.join(ALL)}, cli, daemon")
    ap.add_argument("--trace-requests", type=int, help="trace length (default 300; smoke 12)")
    ap.add_argument("--doc", type=Path, help="report path (default docs/benchmarks.md; "
                    "with --out: <out>/benchmarks.md)")
    ap.add_argument("--no-report", action="store_true", help="write the JSON results only")
    args = ap.parse_args(argv)

    from modeld.model import probe

    out = args.out or RESULTS
    model = harness.tiny(seed=0) if args.smoke else harness.default_model()
    ctx = Context(
        smoke=args.smoke,
        rounds=args.rounds or (1 if args.smoke else 10),
        out_dir=out,
        model=model,
        threads=max(1, int(probe.cpu_threads())),
        log=lambda s: print(s, flush=True),
    )
    trace_n = args.trace_requests or (12 if args.smoke else 300)
    t0 = time.monotonic()
    harness.compile_bytecode()
    ctx.log(f"modeld benchmarks: {harness.machine()['cpu']}, threads {ctx.threads}, "
            f"rounds {ctx.rounds}, results in {out}")
    names = _selected(args.only)
    if args.smoke and not args.only:  # the peer build takes minutes, rpc needs an RPC build
        skip = ("parallel", "parallel_sampled", "tree_memory", "rpc", "vision")
        names = [n for n in names if n not in skip]
    run(ctx, names, trace_n)
    if not args.no_report:
        import report

        doc = args.doc or (out / "benchmarks.md" if args.out else None)
        path = report.write(out, doc)
        ctx.log(f"report: {path}")
    ctx.log(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

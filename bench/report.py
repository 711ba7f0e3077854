"""Render docs/benchmarks.md from bench/results/*.json (the numbers are never typed by hand).

The calibration section reuses bench/calibrate.py's table and markers, so either script can
refresh it. The prose under "What the profiles showed" is the analysis written after the runs
(NOTES below); everything in tables comes from the JSON files.

    .venv/bin/python bench/report.py                 # bench/results -> docs/benchmarks.md
    .venv/bin/python bench/report.py --results DIR --doc OUT.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sections
from harness import RESULTS, ROOT, MiB
from notes import NOTES
from plot import cumulative_loads_svg
from sections import (
    agent_session,
    cli_floor,
    gpu,
    heavy,
    kv_cache_type,
    rpc,
    speculation,
    tree_memory,
)

DOC = ROOT / "docs" / "benchmarks.md"
ORDER = ("warm_call", "streaming", "cold_load", "prefix_reuse", "trace", "footprint",
         "cli_startup", "concurrency", "http_api", "structured", "agent_turns",
         "agent_session", "agent_session_peer", "kv_cache_type", "kv_unified", "gpu", "chaos",
         "parallel", "parallel_sampled", "tree_memory", "cli_floor", "pull", "rpc",
         "cluster", "heavy", "vision", "speculation")  # fmt: skip

def _f(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _ms(x: Any) -> str:
    return "-" if x is None else f"{x * 1000:.1f} ms"


def _med(d: Any) -> Any:
    return d.get("median") if isinstance(d, dict) else None


def load(results: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in (*ORDER, "calibration"):
        p = results / f"{name}.json"
        if p.exists():
            out[name] = json.loads(p.read_text())
    return out


def _targets(data: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| benchmark | target | measured | met |", "|---|---|---:|---|"]
    for name in ORDER:
        doc = data.get(name)
        if doc is None:
            lines.append(f"| {name} | (not run) | - | - |")
            continue
        if doc.get("error"):
            lines.append(f"| {doc.get('title', name)} | (failed: {doc['error'][:80]}) | - | no |")
            continue
        for t in doc.get("targets", []):
            lines.append(f"| {doc.get('title', name)} | {t['name']} {t['op']} {t['limit']} | "
                         f"{_f(t['value'])} | {'**met**' if t['met'] else '**not met**'} |")
    return lines


def _section(name: str, doc: dict[str, Any]) -> list[str]:
    out = [f"## {doc.get('title', name)}", "", doc.get("what", ""), ""]
    if doc.get("error"):
        return [*out, f"Failed: `{doc['error']}`", ""]
    out.append(f"Rounds {doc.get('rounds')}; load average {doc.get('loadavg_start')} -> "
               f"{doc.get('loadavg_end')}; {doc.get('duration_s')} s.")
    out.append("")
    render = _RENDER.get(name)
    if render is not None:
        out.extend(render(doc))
        out.append("")
    if NOTES.get(name):
        out.extend([NOTES[name], ""])
    return out


def _pair(doc: dict[str, Any], a: str, b: str, la: str, lb: str, unit: str) -> list[str]:
    fa, fb = (_ms if unit == "s" else _f), (_ms if unit == "s" else _f)
    return [
        f"| | {la} | {lb} | ratio |",
        "|---|---:|---:|---:|",
        f"| median | {fa(_med(doc[a]))} | {fb(_med(doc[b]))} | {_f(doc.get('ratio'))} |",
        f"| p10 / p90 | {fa(doc[a].get('p10'))} / {fa(doc[a].get('p90'))} | "
        f"{fb(doc[b].get('p10'))} / {fb(doc[b].get('p90'))} | |",
    ]


def _warm(doc: dict[str, Any]) -> list[str]:
    return _pair(doc, "modeld_run_s", "standalone_s", "`modeld run`", "standalone script", "s")


def _stream(doc: dict[str, Any]) -> list[str]:
    rows = _pair(doc, "modeld_tokens_per_s", "inproc_tokens_per_s", "modeld (tokens/s)",
                 "in-process (tokens/s)", "rate")
    return [*rows, "", f"n_ctx {doc.get('n_ctx')}, threads {doc.get('threads')}."]


def _cold(doc: dict[str, Any]) -> list[str]:
    rows = _pair(doc, "modeld_s", "inproc_s", "`modeld load`", "in-process, fresh process", "s")
    w = doc.get("inproc_warm_s") or {}
    warm = _ms(w.get("median"))
    rows.append(f"| in-process, a process that loaded before (median) | | {warm} | |")
    rows += ["", "Ratio: modeld over the fresh-process median (each `modeld load` here is a "
             f"spare runner's first load); over the reload median: {_f(doc.get('reload_ratio'))}."]
    inner = _ms(_med(doc.get("daemon_load_seconds")))
    return [*rows, "", f"Inside the runner the load took {inner}"
            f" (median; includes the warm-up); in-process load alone "
            f"{_ms(_med(doc.get('inproc_load_only_s')))}. n_ctx {doc.get('n_ctx')}."]


def _prefix(doc: dict[str, Any]) -> list[str]:
    return [
        "| | first request | second request | greedy: first | greedy: second |",
        "|---|---:|---:|---:|---:|",
        f"| prompt tokens (median) | {_f(_med(doc.get('prompt_tokens')), 0)} | | | |",
        f"| prompt eval (median) | {_ms(_med(doc.get('first_prompt_eval_s')))} | "
        f"{_ms(_med(doc.get('second_prompt_eval_s')))} | "
        f"{_ms(_med(doc.get('greedy_first_prompt_eval_s')))} | "
        f"{_ms(_med(doc.get('greedy_second_prompt_eval_s')))} |",
        f"| tokens reused (median) | | {_f(_med(doc.get('second_reused_tokens')), 0)} | | "
        f"{_f(_med(doc.get('greedy_second_reused_tokens')), 0)} |",
        "", f"Ratio second/first (median of rounds): {_f(doc.get('ratio'))} with the default "
        f"sampling settings; {_f(doc.get('greedy_ratio'))} for greedy requests.",
    ]


TRACE_SVG = "trace-loads.svg"


def _trace_series(doc: dict[str, Any]) -> list[tuple[str, str]]:
    runs = doc.get("runs", {})
    return [("Belady (offline optimum)", doc.get("belady_loaded", "")),
            ("modeld --eviction cost", runs.get("modeld_cost", {}).get("loaded", "")),
            ("modeld --eviction lru", runs.get("modeld_lru", {}).get("loaded", "")),
            ("LRU (simulated)", doc.get("lru_loaded", "")),
            ("llama_cpp.server", runs.get("llama_cpp_server", {}).get("loaded", ""))]


def _trace(doc: dict[str, Any]) -> list[str]:
    rows = ["| system | requests run | loads | total (s) | total scaled to trace (s) | "
            "p50 | p99 |", "|---|---:|---:|---:|---:|---:|---:|",
            f"| offline optimum (Belady, capacity 2) | | {doc.get('belady_optimum_loads')} | | | "
            "| |",
            f"| plain LRU (simulated) | | {doc.get('lru_simulated_loads')} | | | | |"]
    labels = {"modeld_cost": "modeld, --eviction cost (default)", "modeld_lru":
              "modeld, --eviction lru", "process_per_request": "(a) a process per request",
              "llama_cpp_server": "(b) llama_cpp.server (one model at a time)"}
    for key, label in labels.items():
        r = doc.get("runs", {}).get(key, {})
        if "error" in r:
            rows.append(f"| {label} | failed: {r['error'][:60]} | | | | | |")
            continue
        scaled = _f(r.get("scaled_total_s", r.get("total_s")), 1)
        rows.append(f"| {label} | {r.get('requests')} | {r.get('loads')} | "
                    f"{_f(r.get('total_s'), 1)} | {scaled}"
                    f" | {_ms(r.get('p50_s'))} | {_ms(r.get('p99_s'))} |")
    models = ", ".join(f"{m['path']} ({m['bytes'] / MiB:.0f} MiB)" for m in doc.get("models", []))
    rows += ["", f"Models: {models}; memory cap {doc.get('memory_cap_bytes', 0) / MiB:.0f} "
             f"MiB ({doc.get('need_bytes_per_model', 0) / MiB:.0f} MiB reserved per model). "
             f"Requests per model: {doc.get('popularity')}. {doc.get('subset_note', '')}",
             "", f"![cumulative loads over the trace]({TRACE_SVG})", ""]
    per_seed = doc.get("loads_over_seeds") or []
    if per_seed:
        total = doc.get("loads_over_seeds_total", {})
        rows += [f"Loads on {len(per_seed)} traces (seeds {per_seed[0]['seed']}-"
                 f"{per_seed[-1]['seed']}), modeld with its default policy, a fresh daemon per "
                 "trace; the other columns simulated on the same traces:", "",
                 "| | Belady | modeld (cost) | LFU told the true popularity | LRU |",
                 "|---|---:|---:|---:|---:|"]
        for r in per_seed:
            rows.append(f"| seed {r['seed']} | {r['belady']} | {r['modeld_cost']} | "
                        f"{r['lfu_known_simulated']} | {r['lru_simulated']} |")
        b = total.get("belady") or 1
        rows.append(f"| **sum** | {total.get('belady')} | {total.get('modeld_cost')} "
                    f"({total.get('modeld_cost', 0) / b:.3f}x) | {total.get('lfu_known_simulated')}"
                    f" ({total.get('lfu_known_simulated', 0) / b:.3f}x) | "
                    f"{total.get('lru_simulated')} ({total.get('lru_simulated', 0) / b:.3f}x) |")
    return rows


def _footprint(doc: dict[str, Any]) -> list[str]:
    base = doc.get("runner_baseline_bytes")
    spare = doc.get("spare_runner_smaps") or {}
    rows = [
        "| what | RSS |", "|---|---:|",
        f"| daemon, idle at start | {doc['daemon_idle_start']['rss'] / MiB:.1f} MiB |",
        f"| daemon, idle after the workload | {doc['daemon_idle_after']['rss'] / MiB:.1f} MiB |",
        f"| runner baseline (`modeld stats` runner_baseline_bytes) | "
        f"{(base or 0) / MiB:.1f} MiB |",
        f"| spare runner measured (smaps_rollup) | {spare.get('rss', 0) / MiB:.1f} MiB |",
        "", "Estimate vs measured (estimate includes the runner baseline; error = (estimate - "
        "measured) / measured):", "",
        "| source | model | n_ctx | estimate | measured | error |", "|---|---|---:|---:|---:|---:|",
    ]
    for r in doc.get("after_load", []):
        rows.append(f"| `modeld load` reply (fresh daemon) | {r['model']} | {r['n_ctx']} | "
                    f"{(r['estimate_bytes'] or 0) / MiB:.0f} MiB | "
                    f"{(r['measured_bytes'] or 0) / MiB:.0f} MiB | {_pct(r['error'])} |")
    for r in doc.get("loaded", []):
        rows.append(f"| `modeld ps` after the workload (peak) | {r['model']} | {r['n_ctx']} | "
                    f"{(r['estimate_bytes'] or 0) / MiB:.0f} MiB | "
                    f"{(r['measured_bytes'] or 0) / MiB:.0f} MiB | {_pct(r['error'])} |")
    for r in doc.get("calibration", []):
        rows.append(f"| calibration.json | {r['model']} | {r['n_ctx']} | "
                    f"{r['estimate_bytes'] / MiB:.0f} MiB | {r['measured_bytes'] / MiB:.0f} MiB | "
                    f"{_pct(r['error'])} |")
    return rows


def _pct(x: Any) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _cli(doc: dict[str, Any]) -> list[str]:
    rows = ["| command | median | ratio to `python -c pass` |", "|---|---:|---:|"]
    for k, v in doc.get("median_s", {}).items():
        rows.append(f"| `{k}` | {_ms(v)} | {_f(doc['ratio_to_python'].get(k), 2)} |")
    rows += ["", f"Pre-rendered help identical to Typer's: "
             f"{_f(doc.get('help_identical_to_typer'))}.", "", "`python -X importtime` "
             "(cumulative, largest entries):", ""]
    for prof in doc.get("importtime", []):
        top = ", ".join(f"{t['module']} {t['ms']}" for t in prof["top_cumulative_ms"][:6])
        rows.append(f"- `{prof['code']}`: {prof['total_ms']} ms — {top}")
    return rows


def _conc(doc: dict[str, Any]) -> list[str]:
    return [
        "| | concurrent (8 clients) | sequential (1 client) |", "|---|---:|---:|",
        f"| wall | {_f(doc.get('wall_s'), 2)} s | {_f(doc.get('sequential_wall_s'), 2)} s |",
        f"| tokens/s | {_f(doc.get('tokens_per_s'), 1)} | "
        f"{_f(doc.get('sequential_tokens_per_s'), 1)} |",
        f"| requests/s | {_f(doc.get('requests_per_s'), 2)} | |",
        f"| latency p50 / p99 | {_ms(doc.get('latency_p50_s'))} / "
        f"{_ms(doc.get('latency_p99_s'))} | |",
        "", f"Requests {doc.get('requests')} of {doc.get('expected_requests')}; replies "
        f"differing from their reference: {doc.get('mismatch_count')}; errors: "
        f"{len(doc.get('errors', []))}. Models: {', '.join(doc.get('models', []))}.",
        "", "Distinct greedy replies per prompt when it follows each other prompt (one "
        "client): " + ", ".join(f"{k}: {v}" for k, v in
                                 (doc.get("variants_per_prompt") or {}).items()) + ".",
    ]


def _http(doc: dict[str, Any]) -> list[str]:
    return [
        *_pair(doc, "warm_modeld_s", "warm_router_s", "modeld (HTTP)", "llama-server router", "s"
               ),
        "",
        "| | modeld over HTTP (SSE) | in-process | ratio |",
        "|---|---:|---:|---:|",
        f"| tokens/s, median | {_f(_med(doc['http_tokens_per_s']), 1)} | "
        f"{_f(_med(doc['inproc_tokens_per_s']), 1)} | {_f(doc.get('stream_ratio'))} |",
        "",
        f"Idle daemon RSS with the front door on (before any load): "
        f"{(doc.get('idle_rss_bytes') or 0) / MiB:.1f} MiB.",
        "",
        f"Peer: {doc.get('peer_command')}.",
    ]


def _structured(doc: dict[str, Any]) -> list[str]:
    tokens = doc.get("tokens", {})
    return [
        "| decode tokens/s, median | modeld, JSON Schema | modeld, free text | "
        "llama-server --jinja, JSON Schema |",
        "|---|---:|---:|---:|",
        f"| tokens/s | {_f(_med(doc['schema_tokens_per_s']), 1)} | "
        f"{_f(_med(doc['free_tokens_per_s']), 1)} | {_f(_med(doc['router_tokens_per_s']), 1)} |",
        f"| reply tokens, median | {_f(_med(tokens.get('schema', {})), 0)} | "
        f"{_f(_med(tokens.get('free', {})), 0)} | {_f(_med(tokens.get('router', {})), 0)} |",
        "",
        f"Constrained / free: {_f(doc.get('constrained_over_free'))}; modeld / llama-server: "
        f"{_f(doc.get('ratio'))}. Peer: {doc.get('peer_command')}.",
    ]


def _chaos(doc: dict[str, Any]) -> list[str]:
    faults = ", ".join(f"{k} {v}" for k, v in sorted(doc.get("faults", {}).items())) or "none"
    leaked = doc.get("leaked", {})
    lines = [
        "| requests | lost | mixed | leaked runners / fds | peak runner RSS / budget | "
        "accounted vs measured |",
        "|---:|---:|---:|---|---:|---:|",
        f"| {doc.get('requests')} | {doc.get('lost')} | {doc.get('mixed')} | "
        f"{leaked.get('runners')} / {leaked.get('fds')} | "
        f"{(doc.get('peak_rss_bytes') or 0) / MiB:.1f} / {(doc.get('budget_bytes') or 0) / MiB:.1f}"
        f" MiB = {_f(doc.get('peak_over_budget'))} | {_pct(doc.get('accounting_error'))} |",
        "",
        f"Faults injected: {faults}. Runner stalls detected: {doc.get('runner_stalls')}. "
        f"Memory samples: {doc.get('samples')} ({doc.get('samples_over_budget')} over budget).",
        "",
        "| operation | outcomes |",
        "|---|---|",
    ]
    for op, outcomes in doc.get("outcomes", {}).items():
        lines.append(f"| {op} | " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
                     + " |")
    lines += _chaos_leave(doc)
    lines += ["", f"Reproduce: `{doc.get('command')}`."]
    return lines


def _chaos_leave(doc: dict[str, Any]) -> list[str]:
    """Issue 21's part: callers that leave during prompt evaluation, lone surrogates."""
    if "disconnect_to_idle_s" not in doc:
        return []
    out = ["", "Callers that leave during prompt evaluation (bench/chaos_leave.py: the default "
           "model, a ~9,700-token prompt, left 0.8 s into its evaluation), time from leaving to "
           "an idle runner:", "", "| how the caller left | trials | p50 | max |",
           "|---|---:|---:|---:|"]
    for kind, s in doc["disconnect_to_idle_s"].items():
        out.append(f"| {kind} | {s.get('n')} | {_f(s.get('median'), 2)} s | "
                   f"{_f(s.get('max'), 2)} s |")
    every = doc.get("disconnect_to_idle_all_s") or {}
    bad = doc.get("bad_text") or {}
    out += [f"| all | {every.get('n')} | {_f(every.get('median'), 2)} s | "
            f"{_f(every.get('max'), 2)} s |", "",
            f"Wedged models: {len(doc.get('wedged_models') or [])} after the chaos run, "
            f"{len(doc.get('leave_wedged_models') or [])} after the trials, "
            f"{doc.get('leave_wedged')} trials not idle within 60 s. Lone-surrogate requests "
            f"beside a running stream: {bad.get('answered_400')}/{bad.get('sent')} answered 400, "
            f"{bad.get('streams_beside_ok')}/{bad.get('streams')} streams beside them ended "
            "normally."]
    return out


def _parallel(doc: dict[str, Any]) -> list[str]:
    """The concurrency table: modeld beside llama-server's router with the same N."""
    out = ["| | modeld | llama-server router | modeld / router |", "|---|---:|---:|---:|"]
    single = doc.get("single_tokens_per_s") or {}
    m1, r1 = single.get("modeld"), single.get("router")
    out.append(f"| 1 stream, tokens/s | {_f(m1, 1)} | {_f(r1, 1)} | "
               f"{_f(m1 / r1 if m1 and r1 else None, 2)} |")
    for n, res in (doc.get("by_n") or {}).items():
        m, r = res["modeld"], res["router"]
        out += [
            f"| {n} clients x {doc.get('per_client')} requests, aggregate tokens/s | "
            f"{_f(m['tokens_per_s'], 1)} | {_f(r['tokens_per_s'], 1)} | "
            f"{_f(res['ratio_tokens_per_s'], 2)} |",
            f"| {n} clients, p50 request latency | {_f(m['p50_s'], 2)} s | "
            f"{_f(r['p50_s'], 2)} s | {_f(res['ratio_p50'], 2)} |",
            f"| {n} clients, p99 request latency | {_f(m['p99_s'], 2)} s | "
            f"{_f(r['p99_s'], 2)} s | {_f(res['ratio_p99'], 2)} |",
        ]
    ttft = doc.get("ttft_s") or {}
    tm, tr = ttft.get("modeld") or {}, ttft.get("router") or {}
    for when, label in (("idle", "TTFT, idle model"), ("joining", "TTFT, joining 3 streams"),
                        ("joining_step_start", "TTFT, joining 3 streams as a step begins")):
        a, b = tm.get(when), tr.get(when)
        out.append(f"| {label} | {_ms(a)} | {_ms(b)} | {_f(a / b if a and b else None, 2)} |")
    out += ["", f"modeld `--parallel 1` (one sequence per runner, as before): "
            f"{_f(single.get('modeld_parallel_1'), 1)} tokens/s on one stream.", ""]
    for n, res in (doc.get("by_n") or {}).items():
        m, r = res["modeld"], res["router"]
        out.append(f"- N={n}: modeld ran `parallel` {res.get('modeld_parallel')} "
                   f"({res.get('modeld_parallel_reason')}); replies differing from their "
                   f"reference: modeld {m['mismatch']}/{m['requests']}, router "
                   f"{r['mismatch']}/{r['requests']}; errors: modeld {len(m['errors'])}, "
                   f"router {len(r['errors'])}.")
    return out


def _sampled(doc: dict[str, Any]) -> list[str]:
    out = ["| | modeld | llama-server router | modeld / router |", "|---|---:|---:|---:|"]
    for n, res in (doc.get("by_n") or {}).items():
        m, r = res["modeld"], res["router"]
        out.append(f"| {n} clients, temperature {doc.get('temperature')}, aggregate tokens/s "
                   f"(rounds: {m.get('rounds_tokens_per_s')} / {r.get('rounds_tokens_per_s')}) | "
                   f"{_f(m['tokens_per_s'], 1)} | {_f(r['tokens_per_s'], 1)} | "
                   f"{_f(res['ratio_tokens_per_s'], 2)} |")
    return out


def _cluster(doc: dict[str, Any]) -> list[str]:
    """Placement against round-robin through the same cluster ingress."""
    a, b = doc.get("placement") or {}, doc.get("round-robin") or {}

    def ratio(key: str) -> str:
        x, y = a.get(key), b.get(key)
        return _f(x / y if x is not None and y else None, 2)

    out = ["| | placement | round-robin | placement / round-robin |", "|---|---:|---:|---:|"]
    out.append(f"| cold loads (all rounds) | {a.get('cold_loads')} | {b.get('cold_loads')} | "
               f"{ratio('cold_loads')} |")
    for key, label in (("p50_s", "p50 latency"), ("p95_s", "p95 latency")):
        out.append(f"| {label} (all rounds) | {_f(a.get(key), 2)} s | "
                   f"{_f(b.get(key), 2)} s | {ratio(key)} |")
    out.append(f"| requests/s (all rounds) | {_f(a.get('rps'), 2)} | {_f(b.get('rps'), 2)} "
               f"| {ratio('rps')} |")
    out.append(f"| requests / errors | {a.get('requests')} / {a.get('n_errors')} | "
               f"{b.get('requests')} / {b.get('n_errors')} | |")
    return out


def _pull(doc: dict[str, Any]) -> list[str]:
    def row(label: str, a: str, b: str, ratio: Any) -> str:
        return (f"| {label} | {_f(_med(doc[a]), 0)} ({_f(doc[a].get('min'), 0)}-"
                f"{_f(doc[a].get('max'), 0)}) | {_f(_med(doc[b]), 0)} ({_f(doc[b].get('min'), 0)}"
                f"-{_f(doc[b].get('max'), 0)}) | {_f(ratio)} |")

    return ["| MiB/s, median (min-max) | `modeld pull` | `curl -o` | modeld / curl |",
            "|---|---:|---:|---:|",
            row("transfer", "modeld_mib_s", "curl_mib_s", doc.get("ratio")),
            row("whole command", "modeld_wall_mib_s", "curl_wall_mib_s", doc.get("wall_ratio")),
            f"| CPU s per GiB (whole command) | {_f(_med(doc.get('modeld_cpu_s_per_gib', {})), 2)}"
            f" | {_f(_med(doc.get('curl_cpu_s_per_gib', {})), 2)} | |"]


def _agent(doc: dict[str, Any]) -> list[str]:
    def tokens(key: str) -> str:
        return _f(_med(doc.get(key)), 0)

    return [
        "| | first turn | second turn | ratio |",
        "|---|---:|---:|---:|",
        f"| time to first token (median) | {_f(_med(doc.get('first_ttft_s')), 2)} s | "
        f"{_f(_med(doc.get('second_ttft_s')), 2)} s | {_f(doc.get('ratio'))} |",
        f"| prompt tokens (median) | {tokens('first_prompt_tokens')} | "
        f"{tokens('second_prompt_tokens')} | |",
        f"| second turn: evaluated / from the prompt cache (median) | | "
        f"{tokens('second_evaluated_tokens')} / {tokens('second_cached_tokens')} | |",
    ]


_RENDER = {"warm_call": _warm, "streaming": _stream, "cold_load": _cold, "prefix_reuse": _prefix,
           "trace": _trace, "footprint": _footprint, "cli_startup": _cli, "concurrency": _conc,
           "chaos": _chaos, "http_api": _http, "structured": _structured,
           "agent_turns": _agent, "agent_session": agent_session,
           "agent_session_peer": sections.agent_session_peer, "parallel": _parallel,
           "parallel_sampled": _sampled,
           "pull": _pull, "rpc": rpc, "cluster": _cluster, "tree_memory": tree_memory,
           "heavy": heavy, "vision": sections.vision,
           "cli_floor": cli_floor, "kv_cache_type": kv_cache_type, "gpu": gpu,
           "kv_unified": sections.kv_unified, "speculation": speculation}


def _calibration(data: dict[str, dict[str, Any]]) -> list[str]:
    import calibrate

    cal = data.get("calibration")
    out = ["## Memory estimate calibration", "",
           "From bench/calibrate.py (bench/results/calibration.json): "
           + (cal or {}).get("protocol", "not run") + ".", ""]
    if cal:
        out.append(f"{calibrate.BEGIN}\n{calibrate.markdown_table(cal['cases'])}{calibrate.END}")
    else:
        out.append(f"{calibrate.BEGIN}\n(run bench/calibrate.py)\n{calibrate.END}")
    return [*out, ""]


def render(results: Path) -> str:
    data = load(results)
    some = next((d for d in data.values() if "machine" in d and d.get("benchmark")), None)
    m = (some or {}).get("machine", {})
    lines = [
        "# Benchmarks", "",
        "Generated by `scripts/bench.sh` (bench/run.py, then bench/report.py) from "
        "bench/results/*.json; do not edit the tables by hand.", "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
        f"{(m.get('ram_bytes') or 0) / (1 << 30):.1f} GiB RAM, {m.get('platform', '?')}, "
        f"Python {m.get('python', '?')}, llama-cpp-python {m.get('llama_cpp_python', '?')}, "
        f"pyzmq {m.get('pyzmq', '?')}.", "",
        "Method: alternatives run interleaved (A B, then B A, ...) in the same run; medians "
        "and ratios are what count; absolute times are context only (the machine is shared "
        "and has 2 cores).", "",
        "## Targets", "", *_targets(data), "",
    ]
    if NOTES.get("_summary"):
        lines += [NOTES["_summary"], ""]
    for name in ORDER:
        if name in data:
            lines += _section(name, data[name])
    lines += _calibration(data)
    return "\n".join(lines).rstrip("\n") + "\n"


def write(results: Path = RESULTS, doc: Path | None = None) -> Path:
    doc = doc or DOC
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(render(results))
    trace = load(results).get("trace")
    if trace and "runs" in trace:
        svg = cumulative_loads_svg(f"Trace: cumulative loads over {len(trace.get('trace', ''))}"
                                   " requests (seed 0)", _trace_series(trace))
        (doc.parent / TRACE_SVG).write_text(svg)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--doc", type=Path, default=DOC)
    args = ap.parse_args(argv)
    print(write(args.results, args.doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Report sections of the RPC, memory and CLI-floor benchmarks (report.py renders the rest;
split off to keep each module short)."""

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
    for side in ("modeld", "modeld_processes", "router"):
        part = doc.get(side)
        if not part:
            continue
        label = {"modeld_processes": "modeld, runner_fork false"}.get(side, side)
        for p in part["processes"]:
            role = p["role"] if not p["role"].startswith("server: ") else "llama-server child"
            rows.append(f"| {label} | {role} | {_mib(p['rss'])} | {_mib(p['pss'])} | "
                        f"{_mib(p['anon'])} |")
        t = part["total"]
        rows.append(f"| {label} | **total** | **{_mib(t['rss'])}** | **{_mib(t['pss'])}** | "
                    f"{_mib(t['anon'])} |")
    idle = (doc.get("modeld") or {}).get("idle_after_s")
    rows += ["", f"Read idle ({idle} s after the run: modeld's fork server exits "
             "`runner_fork_idle_s` after its last fork). Ratios to the router: PSS "
             f"{doc.get('ratio_pss', 0):.3f}, RSS {doc.get('ratio_rss', 0):.3f}; with runners "
             "as new processes (`runner_fork` false, spare runner kept) PSS "
             f"{doc.get('ratio_pss_processes', 0):.3f}, RSS "
             f"{doc.get('ratio_rss_processes', 0):.3f}."]
    quiet = (doc.get("modeld") or {}).get("quiet")
    if quiet and doc.get("ratio_pss_quiet") is not None:
        parts = ", ".join(f"{p['role']} {_mib(p['pss'])}" for p in quiet["processes"])
        rows += ["", f"Read quiet (half a second without CPU, right after the run; the fork "
                 f"server still up), modeld PSS by process: {parts}; total "
                 f"{_mib(quiet['total']['pss'])} MiB against the router's "
                 f"{_mib(doc['router']['quiet']['total']['pss'])}: PSS "
                 f"{doc['ratio_pss_quiet']:.3f}, RSS {doc.get('ratio_rss_quiet', 0):.3f}."]
    return rows


def cli_floor(doc: dict[str, Any]) -> list[str]:
    med = doc.get("median_s", {})
    rows = ["| command | median |", "|---|---:|"]
    rows += [f"| `{k}` | {v * 1000:.1f} ms |" for k, v in med.items()]
    rows += ["", f"{doc.get('rounds')} interleaved rounds. `modeld ps` / `python -c pass` "
             f"{doc.get('ratio_ps_to_python', 0):.2f}; warm 1-token `modeld run` / curl "
             f"{doc.get('ratio_run_to_curl', 0):.2f}."]
    return rows


def _f1(x: Any, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _rate(r: dict[str, Any]) -> str:
    return f"{_f1(r.get('median'))} ({_f1(r.get('min'))}-{_f1(r.get('max'))})"


def rpc(doc: dict[str, Any]) -> list[str]:
    rows = ["| configuration | load (s) | bytes over lo at load | decode tokens/s, median "
            "(min-max) | lo bytes per token, median | layers on workers |",
            "|---|---:|---:|---:|---:|---|"]
    for label, r in doc.get("configs", {}).items():
        load = r.get("load_s")
        rows.append(f"| {label} | {'-' if load is None else f'{load:.2f}'} | "
                    f"{r.get('load_lo_bytes', 0) / MiB:.0f} MiB | "
                    f"{_rate(r.get('tokens_per_s', {}))} | "
                    f"{_f1((r.get('lo_bytes_per_token') or {}).get('median'))} | "
                    f"{r.get('layers_offloaded') or '-'} |")
    versus = doc.get("versus") or {}
    if versus:
        rows += ["", "Interleaved, 2 workers each (llama-server's bytes per token include its "
                 "HTTP reply; paired: the median of each round's modeld / it):", "",
                 "| decoder | decode tokens/s, median (min-max) | modeld / it | paired | "
                 "lo bytes per token |", "|---|---:|---:|---:|---:|"]
        for name, r in versus.items():
            ratio = (doc.get("ratio_vs") or {}).get(name)
            pair = (doc.get("ratio_paired") or {}).get(name)
            rows.append(f"| {name} | {_rate(r.get('tokens_per_s', {}))} | "
                        f"{'-' if ratio is None else f'{ratio:.3f}'} | "
                        f"{'-' if pair is None else f'{pair:.3f}'} | "
                        f"{_f1((r.get('lo_bytes_per_token') or {}).get('median'))} |")
    rows += ["", f"Greedy replies equal to the local ones: {doc.get('greedy_equal')}."]
    return rows


def _two_sessions(first: dict[str, Any], second: dict[str, Any], names: tuple[str, str],
                  head: str) -> list[str]:
    """Per turn, two runs of one session side by side, then each run's totals."""
    rows = [f"| turn | prompt tokens | evaluated | from the cache | TTFT s | n_ctx after | "
            f"{head}: evaluated | {head}: TTFT s |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    other = {t["turn"]: t for t in second.get("turns", [])}
    for t in first.get("turns", []):
        o = other.get(t["turn"], {})
        rows.append(f"| {t['turn']} | {t['prompt_tokens']} | {t['evaluated']} | {t['cached']} | "
                    f"{t['ttft_s']:.2f} | {t['n_ctx']} | {o.get('evaluated', '-')} | "
                    + (f"{o['ttft_s']:.2f} |" if "ttft_s" in o else "- |"))
    for name, part in zip(names, (first, second), strict=True):
        if part:
            rows.append(f"| **{name}** | final {part['final_prompt']} | "
                        f"**{part['evaluated_total']}** ({part['ratio']:.3f} x) | | "
                        f"session {part['total_s']:.0f} s | reloads {part['reloads']} | | |")
    return rows


def agent_session(doc: dict[str, Any]) -> list[str]:
    """Per turn, the session with the handoff and the control without (b_session.py)."""
    return _two_sessions(doc.get("carried") or {}, doc.get("control") or {},
                         ("handoff", "control (prompt cache off)"), "control")


def agent_session_peer(doc: dict[str, Any]) -> list[str]:
    """Per turn, modeld beside llama-server --jinja on the same session (b_session.py)."""
    return _two_sessions(doc.get("modeld") or {}, doc.get("llama_server") or {},
                         ("modeld", "llama-server --jinja"), "llama-server")


def heavy(doc: dict[str, Any]) -> list[str]:
    """Issue 35: a stream's longest gap beside each heavy request (b_heavy.py)."""
    rows = ["| beside | status | request s | stream's longest gap s | median gap s |",
            "|---|---:|---:|---:|---:|"]
    for name, r in doc.get("cases", {}).items():
        gaps = r.get("gaps_s") or {}
        seconds = r.get("seconds")
        rows.append(f"| {name} | {r.get('status', '-')} | "
                    f"{'-' if seconds is None else f'{seconds:.2f}'} | "
                    f"{r.get('max_gap_s') or 0:.3f} | {gaps.get('median') or 0:.3f} |")
    s = doc.get("sampler", {})
    rows += ["", f"Daemon RSS {_mib(doc.get('daemon_rss_before'))} MiB before, "
             f"{_mib(doc.get('daemon_rss_after'))} MiB after. Grammar sampler, a 10,000-word "
             f"enum, worst token with the whole vocabulary masked: flat alternation "
             f"{s.get('flat_worst_token_s', 0):.3f} s (made in {s.get('flat_init_s', 0):.3f} s), "
             f"prefix tree {s.get('tree_worst_token_s', 0):.4f} s (made in "
             f"{s.get('tree_init_s', 0):.3f} s)."]
    return rows


def kv_cache_type(doc: dict[str, Any]) -> list[str]:
    rows = ["| n_ctx | KV type | estimate MiB | measured MiB | error | saved vs f16: measured / "
            "estimated MiB |", "|---:|---|---:|---:|---:|---:|"]
    for r in doc.get("rows", []):
        saved = "" if r["kv_cache_type"] == "f16" else (
            f"{_mib(r.get('saved_measured'))} / {_mib(r.get('saved_estimated'))}")
        rows.append(f"| {r['n_ctx']} | {r['kv_cache_type']} | {_mib(r['estimate_bytes'])} | "
                    f"{_mib(r['measured_bytes'])} | {r['error'] * 100:+.1f}% | {saved} |")
    return rows


def kv_unified(doc: dict[str, Any]) -> list[str]:
    rows = ["| layout | n_ctx x 4 | estimate MiB | measured MiB | error |",
            "|---|---:|---:|---:|---:|"]
    rows += [f"| {r['layout']} | {r['n_ctx']} | {_mib(r['estimate_bytes'])} | "
             f"{_mib(r['measured_bytes'])} | {r['error'] * 100:+.1f}% |"
             for r in doc.get("rows", [])]
    rows += ["", "| layout | cells | long prompt tokens | long s | its n_ctx | short median s | "
             "reloads |", "|---|---:|---:|---:|---:|---:|---:|"]
    rows += [f"| {m['layout']} | {m['pool_cells']} | {m['long_prompt_tokens']} | "
             f"{m['long_s']:.2f} | {m['long_n_ctx']} | {m['short_median_s']:.2f} | "
             f"{m['reloads']} |" for m in doc.get("mixed", [])]
    return rows


def gpu(doc: dict[str, Any]) -> list[str]:
    """The card run (bench/gpu_bench.py on scripts/gpu-check.sh's machine)."""
    rows = [f"Card: {doc.get('card')}.", "", "| n_ctx x sequences | NVML per process MiB | "
            "estimate MiB | error |", "|---|---:|---:|---:|"]
    rows += [f"| {v['n_ctx']} x {v['n_seq']} | {_mib(v['nvml'])} | {_mib(v['estimate'])} | "
             f"{v['error'] * 100:+.1f}% |" for v in doc.get("vram", [])]
    server = {(r["np"], r.get("ngl", 99)): r for r in doc.get("server", [])}
    rows += ["", "| clients | layers on the card | llama-server -np N tok/s | modeld parallel N "
             "tok/s |", "|---:|---|---:|---:|"]
    for r in doc.get("modeld", []):
        full = r.get("gpu_layers", -1) == -1
        s = server.get((r.get("clients"), 99)) if full else next(
            (v for (n, ngl), v in server.items() if n == 1 and ngl != 99), None)
        rows.append(f"| {r.get('clients')} | {'all' if full else (s or {}).get('ngl', 'half')} | "
                    f"{_f1((s or {}).get('aggregate_tok_s'))} | {_f1(r.get('aggregate_tok_s'))} |")
    cold, first, ttft = doc.get("cold_load") or {}, server.get((1, 99), {}), doc.get("ttft") or {}
    rows += ["", f"Cold load: modeld `load` {_f1(cold.get('wall_s'), 2)} s (runner "
             f"{_f1(cold.get('load_seconds'), 2)} s), llama-server start to ready "
             f"{_f1(first.get('ready_s'), 2)} s. First token of a ~3,000-token prompt (median "
             f"of 3): modeld {_f1(ttft.get('modeld_s'), 3)} s, llama-server "
             f"{_f1(ttft.get('server_s'), 3)} s."]
    return rows


def vision(doc: dict[str, Any]) -> list[str]:
    """Issue 38: a 1-image question and the repeated-image turn, modeld vs llama-server."""
    def cell(part: dict[str, Any], key: str) -> str:
        s = part.get(key) or {}
        return (f"{s['median'] * 1000:.1f} ms ({s['p10'] * 1000:.0f}–{s['p90'] * 1000:.0f})"
                if s.get("median") is not None else "-")

    def tokens(part: dict[str, Any], key: str) -> str:
        u = part.get(key) or {}
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
        return f"{u.get('prompt_tokens', '-')}" + (f" ({cached} cached)" if cached else "")

    m, p = doc.get("modeld") or {}, doc.get("llama_server") or {}
    pair = doc.get("pair") or {}
    rows = ["| | modeld | llama-server --mmproj | ratio |", "|---|---:|---:|---:|",
            f"| turn 1: new image, median (p10–p90) | {cell(m, 'first_s')} | "
            f"{cell(p, 'first_s')} | {doc.get('ratio') or 0:.3f} |",
            f"| turn 2: same image again | {cell(m, 'repeat_s')} | {cell(p, 'repeat_s')} | |",
            f"| turn 2 / turn 1 | {doc.get('repeat_ratio') or 0:.3f} | "
            f"{doc.get('peer_repeat_ratio') or 0:.3f} | |",
            f"| prompt tokens, turn 1 / turn 2 | {tokens(m, 'usage_first')} / "
            f"{tokens(m, 'usage_repeat')} | {tokens(p, 'usage_first')} / "
            f"{tokens(p, 'usage_repeat')} | |",
            "", f"Pair: text {pair.get('text')}; projector {pair.get('projector')}; "
            f"{pair.get('image_tokens')} image tokens; n_ctx {doc.get('n_ctx')}, "
            f"{doc.get('threads')} threads on both sides; CPU flags "
            f"`{' '.join(doc.get('cpu_flags') or [])}`."]
    return rows


def speculation(doc: dict[str, Any]) -> list[str]:
    """Issue 46: drafts on against off per workload (bench/spec_speed.py)."""
    rows = ["| workload | sampling | tok/s off | tok/s on | on / off | drafted | accepted | "
            "acceptance | replies differing |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc.get("results", []):
        rows.append(f"| {r['workload']} | {r['sampling']} | {_f1(r['tps_off'])} | "
                    f"{_f1(r['tps_on'])} | {_f1(r['speedup'], 2)} | {r['drafted']} | "
                    f"{r['accepted']} | {_f1(r['acceptance'], 2)} | {r['differ']} of "
                    f"{doc.get('rounds')} |")
    m = doc.get("machine") or {}
    rows += ["", f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, shared with other "
             "work during the run (absolute rates are context only; each pair ran interleaved). "
             "Sampled replies use one seed; a differing one is a near-tie drawn the other way "
             "(a lone sampled row past 512 cells is computed one way, a checked draft another: "
             "runner/speculate.py)."]
    return rows

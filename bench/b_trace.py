"""Trace benchmark (5): three models, room for two, a seeded Zipf-with-bursts request trace.

Replayed closed-loop (one request after another, as a shell loop or one user would) against:

* modeld, once per eviction policy (``--eviction cost`` and ``--eviction lru``), with
  ``--memory-cap`` set so that two of the three models fit but not three;
* (a) a new process per request (``bench/inproc.py once``: import, load, generate);
* (b) llama-cpp-python's own server (``python -m llama_cpp.server --config_file``) with all
  three models configured: it holds one model and swaps on demand.

Loads are counted (modeld: ``stats.loads``; the server: model switches; a process per request:
every request) and compared with the offline optimum for capacity 2 (Belady: evict the model
whose next use is furthest away), the floor for any cache that serves requests in order.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness import (
    PY,
    ROOT,
    Context,
    daemon,
    free_port,
    generated,
    percentile,
    run_timed,
    target,
    tiny,
)

# Three distinct q8_0 llama models (about 100 MiB each; different seeds, different files).
TRACE_MODEL = dict(n_layer=8, n_embd=768, n_head=12, n_head_kv=4, n_ff=2048, n_vocab=32000,
                   context_length=2048, dtype="q8_0")  # fmt: skip
N_CTX = 512
MAX_TOKENS = 4
PROMPTS = ("The river and the stone", "A letter from the harbor", "Morning over the orchard",
           "Thunder in the mountains")  # fmt: skip


def make_trace(seed: int, n: int, models: int = 3, zipf_s: float = 1.0,
               mean_burst: float = 4.0) -> list[int]:
    """Bursts of requests for one model; the model of each burst Zipf-distributed."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** zipf_s for i in range(models)]
    out: list[int] = []
    while len(out) < n:
        m = rng.choices(range(models), weights)[0]
        burst = 1 + int(rng.expovariate(1.0 / (mean_burst - 1.0)))
        out.extend([m] * min(burst, n - len(out)))
    return out


def lru_loads(seq: list[int], cap: int) -> int:
    cache: list[int] = []
    loads = 0
    for x in seq:
        if x in cache:
            cache.remove(x)
        else:
            loads += 1
            if len(cache) >= cap:
                cache.pop(0)
        cache.append(x)
    return loads


def belady_loads(seq: list[int], cap: int) -> int:
    """Offline optimum: on a miss with a full cache, evict the model used furthest ahead."""
    cache: set[int] = set()
    loads = 0
    for i, x in enumerate(seq):
        if x in cache:
            continue
        loads += 1
        if len(cache) >= cap:

            def next_use(y: int, i: int = i) -> int:
                for j in range(i + 1, len(seq)):
                    if seq[j] == y:
                        return j
                return len(seq) + 1

            cache.remove(max(cache, key=next_use))
        cache.add(x)
    return loads


def _lat(xs: list[float]) -> dict[str, Any]:
    return {"p50_s": percentile(xs, 50), "p99_s": percentile(xs, 99), "n": len(xs)}


def _run_modeld(ctx: Context, paths: list[Path], trace: list[int], cap: int,
                policy: str) -> dict[str, Any]:
    args = ["--memory-cap", str(cap), "--ctx-floor", str(N_CTX), "--ctx-ceiling", str(N_CTX),
            "--threads", str(ctx.threads), "--eviction", policy, "--keep-alive", "-1"]
    with daemon(*args) as d:
        c = d.client()
        lat: list[float] = []
        t0 = time.perf_counter()
        for i, m in enumerate(trace):
            t = time.perf_counter()
            c.generate(str(paths[m]), PROMPTS[i % len(PROMPTS)], raw=True,
                       max_tokens=MAX_TOKENS, temperature=0.0, seed=0).text()
            lat.append(time.perf_counter() - t)
        total = time.perf_counter() - t0
        stats = c.stats()
    return {"loads": stats["loads"], "evictions": stats.get("evictions"), "total_s": total,
            **_lat(lat), "requests": len(trace), "policy": policy,
            "load_seconds_mean": stats.get("load_seconds_mean")}


def _run_process_per_request(ctx: Context, paths: list[Path], trace: list[int]) -> dict[str, Any]:
    lat = []
    for i, m in enumerate(trace):
        dt, _ = run_timed([PY, str(ROOT / "bench" / "inproc.py"), "once", str(paths[m]),
                           str(N_CTX), str(ctx.threads), str(MAX_TOKENS),
                           PROMPTS[i % len(PROMPTS)]])
        lat.append(dt)
    return {"loads": len(trace), "total_s": sum(lat), **_lat(lat), "requests": len(trace)}


def _run_server(ctx: Context, paths: list[Path], trace: list[int],
                workdir: Path) -> dict[str, Any]:
    port = free_port()
    config = {
        "host": "127.0.0.1",
        "port": port,
        "models": [
            {"model": str(p), "model_alias": f"m{i}", "n_ctx": N_CTX, "n_batch": N_CTX,
             "n_ubatch": N_CTX, "n_threads": ctx.threads, "n_threads_batch": ctx.threads,
             "flash_attn": True, "seed": 0, "verbose": False}
            for i, p in enumerate(paths)
        ],
    }
    cfg = workdir / "llama_server.json"
    cfg.write_text(json.dumps(config))
    log = open(workdir / "llama_server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([PY, "-m", "llama_cpp.server", "--config_file", str(cfg)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("llama_cpp.server did not start") from None
                time.sleep(0.1)
        lat = []
        loads, current = 1, 0  # it starts with the first configured model loaded
        t0 = time.perf_counter()
        for i, m in enumerate(trace):
            if m != current:
                loads, current = loads + 1, m
            body = json.dumps({"model": f"m{m}", "prompt": PROMPTS[i % len(PROMPTS)],
                               "max_tokens": MAX_TOKENS, "temperature": 0.0, "seed": 0}).encode()
            req = urllib.request.Request(url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            t = time.perf_counter()
            with urllib.request.urlopen(req, timeout=300) as resp:
                json.loads(resp.read())
            lat.append(time.perf_counter() - t)
        total = time.perf_counter() - t0
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return {"loads": loads, "total_s": total, **_lat(lat), "requests": len(trace)}


def _need_bytes(ctx: Context, paths: list[Path]) -> int:
    """What the daemon reserves per model (estimate + runner baseline), asked from a daemon."""
    with daemon("--ctx-floor", str(N_CTX), "--ctx-ceiling", str(N_CTX), spare=True) as d:
        c = d.client()
        return max(int(c.show(str(p))["need_bytes"]) for p in paths)


def trace_bench(ctx: Context, n: int = 300, seed: int = 0, subset_a: int = 30,
                subset_b: int | None = None) -> dict[str, Any]:
    if ctx.smoke:
        paths = [tiny(seed=s) for s in (0, 1, 2)]
    else:
        paths = [generated("llama", **TRACE_MODEL, seed=s) for s in (101, 102, 103)]
    trace = make_trace(seed, n)
    need = _need_bytes(ctx, paths)
    cap = int(need * 2.5)  # two fit, three do not
    runs: dict[str, Any] = {}
    for policy in ("cost", "lru"):
        ctx.log(f"  trace: modeld --eviction {policy}")
        runs[f"modeld_{policy}"] = _run_modeld(ctx, paths, trace, cap, policy)
    sub_a = trace[:subset_a]
    ctx.log(f"  trace: process per request ({len(sub_a)} requests)")
    a = _run_process_per_request(ctx, paths, sub_a)
    a["scaled_total_s"] = a["total_s"] * n / len(sub_a)
    runs["process_per_request"] = a
    sub_b = trace[: subset_b or n]
    ctx.log(f"  trace: llama_cpp.server ({len(sub_b)} requests)")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mdb-srv-") as tmp:
        try:
            b = _run_server(ctx, paths, sub_b, Path(tmp))
            b["scaled_total_s"] = b["total_s"] * n / len(sub_b)
        except (RuntimeError, OSError) as exc:
            b = {"error": str(exc)}
    runs["llama_cpp_server"] = b
    optimum = belady_loads(trace, 2)
    best = runs["modeld_cost"]
    load_ratio = best["loads"] / optimum
    time_ratio = best["total_s"] / b["scaled_total_s"] if "scaled_total_s" in b else None
    return {
        "title": "Trace",
        "what": f"{n} requests, seed {seed}, Zipf(s=1) popularity over 3 models in bursts (mean "
        f"4); each a raw {MAX_TOKENS}-token greedy completion at n_ctx {N_CTX}; closed loop",
        "models": [{"path": p.name, "bytes": p.stat().st_size} for p in paths],
        "need_bytes_per_model": need,
        "memory_cap_bytes": cap,
        "trace_head": trace[:40],
        "popularity": [trace.count(i) for i in range(3)],
        "belady_optimum_loads": optimum,
        "lru_simulated_loads": lru_loads(trace, 2),
        "runs": runs,
        "subset_note": f"(a) ran the first {len(sub_a)} requests and (b) the first {len(sub_b)}; "
        "their totals are scaled to the whole trace",
        "load_ratio": load_ratio,
        "lru_load_ratio": runs["modeld_lru"]["loads"] / optimum,
        "time_ratio_vs_server": time_ratio,
        "targets": [
            target("modeld loads / Belady optimum", load_ratio, 1.2, "<="),
            target("modeld total time / llama_cpp.server", time_ratio, 0.5, "<="),
        ],
    }

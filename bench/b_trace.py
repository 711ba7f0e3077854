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


class _System:
    """One system under test, kept running across the trace's segments."""

    name = ""

    def request(self, model: int, prompt: str) -> None:
        raise NotImplementedError

    def loads(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Modeld(_System):
    def __init__(self, ctx: Context, paths: list[Path], cap: int, policy: str) -> None:
        self.name, self.paths = f"modeld_{policy}", paths
        args = ["--memory-cap", str(cap), "--ctx-floor", str(N_CTX), "--ctx-ceiling",
                str(N_CTX), "--eviction", policy,
                "--keep-alive", "-1"]
        self._cm = daemon(*args)
        self.d = self._cm.__enter__()
        self.c = self.d.client()

    def request(self, model: int, prompt: str) -> None:
        self.c.generate(str(self.paths[model]), prompt, raw=True, max_tokens=MAX_TOKENS,
                        temperature=0.0, seed=0).text()

    def loads(self) -> int:
        return int(self.c.stats()["loads"])

    def stats(self) -> dict[str, Any]:
        st = self.c.stats()
        return {"evictions": st.get("evictions"), "load_seconds_mean": st.get("load_seconds_mean")}

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


class _Server(_System):
    """llama-cpp-python's server with all three models configured (one loaded at a time)."""

    name = "llama_cpp_server"

    def __init__(self, ctx: Context, paths: list[Path], workdir: Path) -> None:
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
        self.log = open(workdir / "llama_server.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([PY, "-m", "llama_cpp.server", "--config_file", str(cfg)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        self._loads, self._current = 1, 0  # it starts with the first configured model loaded
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(self.url + "/v1/models", timeout=2).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("llama_cpp.server did not start") from None
                time.sleep(0.1)

    def request(self, model: int, prompt: str) -> None:
        if model != self._current:
            self._loads, self._current = self._loads + 1, model
        body = json.dumps({"model": f"m{model}", "prompt": prompt, "max_tokens": MAX_TOKENS,
                           "temperature": 0.0, "seed": 0}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            json.loads(resp.read())

    def loads(self) -> int:
        return self._loads

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class _ProcessPerRequest(_System):
    name = "process_per_request"

    def __init__(self, ctx: Context, paths: list[Path]) -> None:
        self.ctx, self.paths, self._loads = ctx, paths, 0

    def request(self, model: int, prompt: str) -> None:
        self._loads += 1
        run_timed([PY, str(ROOT / "bench" / "inproc.py"), "once", str(self.paths[model]),
                   str(N_CTX), str(self.ctx.threads), str(MAX_TOKENS), prompt])

    def loads(self) -> int:
        return self._loads


def _replay(systems: list[_System], trace: list[int], limits: dict[str, int],
            segments: int) -> dict[str, dict[str, Any]]:
    """Play the trace in ``segments`` pieces, every system one piece in turn (rotating the
    order), so machine noise falls on all of them alike; ``limits`` caps a system's requests."""
    size = -(-len(trace) // segments)
    lat: dict[str, list[float]] = {s.name: [] for s in systems}
    for k in range(segments):
        order = systems[k % len(systems):] + systems[: k % len(systems)]
        for system in order:
            quota = -(-limits.get(system.name, len(trace)) // segments)  # spread the sample
            for i in range(k * size, min(len(trace), k * size + quota, (k + 1) * size)):
                t = time.perf_counter()
                system.request(trace[i], PROMPTS[i % len(PROMPTS)])
                lat[system.name].append(time.perf_counter() - t)
    out = {}
    for system in systems:
        xs = lat[system.name]
        out[system.name] = {"requests": len(xs), "loads": system.loads(), "total_s": sum(xs),
                            "scaled_total_s": sum(xs) * len(trace) / len(xs) if xs else None,
                            **_lat(xs)}
        if isinstance(system, _Modeld):
            out[system.name].update(system.stats())
    return out


def _need_bytes(ctx: Context, paths: list[Path]) -> int:
    """What the daemon reserves per model (estimate + runner baseline), asked from a daemon."""
    with daemon("--ctx-floor", str(N_CTX), "--ctx-ceiling", str(N_CTX), spare=True) as d:
        c = d.client()
        return max(int(c.show(str(p))["need_bytes"]) for p in paths)


def trace_bench(ctx: Context, n: int = 300, seed: int = 0, subset_a: int = 30,
                segments: int = 5) -> dict[str, Any]:
    if ctx.smoke:
        paths = [tiny(seed=s) for s in (0, 1, 2)]
    else:
        paths = [generated("llama", **TRACE_MODEL, seed=s) for s in (101, 102, 103)]
    trace = make_trace(seed, n)
    need = _need_bytes(ctx, paths)
    cap = int(need * 2.5)  # two fit, three do not
    import tempfile

    systems: list[_System] = []
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="mdb-srv-") as tmp:
        try:
            for policy in ("cost", "lru"):
                systems.append(_Modeld(ctx, paths, cap, policy))
            try:
                systems.append(_Server(ctx, paths, Path(tmp)))
            except (RuntimeError, OSError) as exc:
                errors["llama_cpp_server"] = str(exc)
            systems.append(_ProcessPerRequest(ctx, paths))
            ctx.log(f"  trace: {n} requests over {', '.join(s.name for s in systems)}, "
                    f"interleaved in {segments} segments")
            runs: dict[str, Any] = _replay(systems, trace, {"process_per_request": subset_a},
                                           segments)
        finally:
            for system in systems:
                system.close()
    for name, err in errors.items():
        runs[name] = {"error": err}
    b = runs.get("llama_cpp_server", {})
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
        "subset_note": f"The systems ran side by side, the trace split in {segments} segments "
        f"played by each in turn; (a) ran {runs.get('process_per_request', {}).get('requests')}"
        " requests spread over the segments, its total scaled to the whole trace.",
        "load_ratio": load_ratio,
        "lru_load_ratio": runs["modeld_lru"]["loads"] / optimum,
        "time_ratio_vs_server": time_ratio,
        "targets": [
            target("modeld loads / Belady optimum", load_ratio, 1.2, "<="),
            target("modeld total time / llama_cpp.server", time_ratio, 0.5, "<="),
        ],
    }

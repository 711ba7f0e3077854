"""Cluster routing (issue 24): two daemons behind the Ray Serve ingress, K models that one
daemon cannot hold at once, M closed-loop clients with a skewed model mix; modeld's placement
(a request goes where its model is warm) against round-robin across the same daemons (what a
placement-blind proxy does).

    .venv/bin/python bench/b_cluster.py            # about 4-5 minutes on 2 cores
    .venv/bin/python bench/b_cluster.py --smoke    # fewer requests, one round (about 1 minute)

One ``ray.cluster_utils.Cluster`` of two simulated nodes (each offers the resource ``modeld``
and runs its own daemon: ``--max-models 2``, so 2 of the K = 4 models fit on each), deployed
with ``modeld cluster serve``'s library call; each policy is a redeploy of the ingress. Before
each phase both daemons unload everything, so each phase starts cold. Every request is a
non-streamed ``/api/generate`` (8 tokens, greedy) through the ingress, the same seeded model
sequence per client for both policies; phases run A B, then B A. Reported per policy: cold loads
(the daemons' ``loads`` counters), latency p50/p95, requests/s, and each request's start, model,
serving node (the ingress's ``x-modeld-node`` header) and latency.

The models are generated llamas of 64 MiB (6 layers, 512 wide, f16): big enough that a load
costs something (runner, mmap, warm-up), as a real model's does; with 13 MiB models a
load is nearly free and the comparison is only about probing overhead. Requests are sampled
(temperature 0.8, a seed each): greedy ones run one at a time per model (the daemon's
determinism rule), which would measure that rule rather than routing.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
from harness import RESULTS, Context, daemon, free_port, percentile, summary, target, write_result

K_MODELS = 4
WEIGHTS = (0.45, 0.25, 0.18, 0.12)  # skewed: one model takes almost half the requests
SHAPE = dict(n_layer=6, n_embd=512, n_head=8, n_ff=1024, n_vocab=16000, context_length=2048,
             dtype="f16")
POLICIES = ("placement", "round-robin")


def _phase(url: str, daemons: list[Any], clients: int, per_client: int,
           seed: int, temperature: float) -> dict[str, Any]:
    import httpx

    watchers = [d.client() for d in daemons]
    for c in watchers:
        c.unload(all=True)
    time.sleep(0.5)
    loads0 = [int(c.stats()["loads"]) for c in watchers]
    lat: list[float] = []
    trace: list[tuple[float, int, str, float]] = []  # (start offset, model, node, seconds)
    errors: list[str] = []
    lock = threading.Lock()
    started = time.perf_counter()

    def run(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        with httpx.Client(base_url=url, timeout=120.0) as http:
            for _ in range(per_client):
                model = rng.choices(range(K_MODELS), WEIGHTS)[0]
                t = time.perf_counter()
                r = http.post("/api/generate", json={
                    "model": f"m{model}", "prompt": "The lighthouse", "stream": False,
                    "options": {"num_predict": 8, "temperature": temperature,
                                "seed": rng.randrange(1 << 30)}})
                took = time.perf_counter() - t
                with lock:
                    trace.append((round(t - started, 3), model,
                                  r.headers.get("x-modeld-node", "?"), round(took, 3)))
                    if r.status_code == 200:
                        lat.append(took)
                    else:
                        errors.append(r.text[:200])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    loads = sum(int(c.stats()["loads"]) - l0 for c, l0 in zip(watchers, loads0, strict=True))
    return {"cold_loads": loads, "latency_s": summary(lat), "p50_s": percentile(lat, 50),
            "p95_s": percentile(lat, 95), "requests": len(lat), "errors": errors[:3],
            "n_errors": len(errors), "wall_s": wall, "rps": len(lat) / wall,
            "trace": sorted(trace)}


def cluster_bench(ctx: Context, clients: int, per_client: int,
                  temperature: float = 0.8) -> dict[str, Any]:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from modeld.cluster import serve as cluster_serve
    from modeld.config import Settings

    models = Path(tempfile.mkdtemp(prefix="mdb-cluster-models-", dir="/tmp"))
    for i in range(K_MODELS):
        os.symlink(harness.generated("llama", **SHAPE, seed=200 + i), models / f"m{i}.gguf")
    args = ("--max-models", "2", "--keep-alive", "-1", "--prompt-cache-mib", "0")
    with daemon(*args, env={"MODELD_MODELS": str(models)}) as d0, \
            daemon(*args, env={"MODELD_MODELS": str(models)}) as d1:
        small = {"object_store_memory": 100 * 1024 * 1024, "num_cpus": 1}

        def node_env(d: Any, name: str) -> dict[str, str]:
            return {"MODELD_SOCKET": d.endpoint, "MODELD_MODELS": str(models),
                    "MODELD_NODE_NAME": name, "MODELD_NO_AUTOSTART": "1"}

        cluster = Cluster(initialize_head=True, head_node_args={
            **small, "resources": {"modeld": 1}, "include_dashboard": False,
            "env_vars": node_env(d0, "node-a")})
        cluster.add_node(**small, resources={"modeld": 1}, env_vars=node_env(d1, "node-b"))
        try:
            ray.init(address=cluster.address, logging_level="warning", log_to_driver=False)
            port = free_port()
            settings = Settings(http=f"127.0.0.1:{port}")
            runs: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
            for r in range(ctx.rounds):
                for policy in POLICIES if r % 2 == 0 else tuple(reversed(POLICIES)):
                    got = cluster_serve.deploy(settings, policy=policy)
                    _wait_up(got["url"])
                    ctx.log(f"   {policy} (round {r + 1})")
                    runs[policy].append(_phase(got["url"], [d0, d1], clients, per_client, r,
                                              temperature))
        finally:
            serve.shutdown()
            ray.shutdown()
            cluster.shutdown()
    out: dict[str, Any] = {p: _merge(v) for p, v in runs.items()}
    a, b = out["placement"], out["round-robin"]
    loads_ratio = a["cold_loads"] / b["cold_loads"] if b["cold_loads"] else None
    return {
        "title": "Cluster routing: placement vs round-robin (2 daemons on Ray Serve)",
        "what": (f"{K_MODELS} models ({', '.join(f'{w:.0%}' for w in WEIGHTS)} of requests), 2 "
                 f"daemons holding 2 models each, {clients} closed-loop clients x {per_client} "
                 "requests per phase through the ingress (/api/generate, 8 tokens)."),
        "runs": runs, **out, "cold_loads_ratio": loads_ratio,
        "targets": [
            target("placement cold loads / round-robin cold loads", loads_ratio, 0.5, "<="),
            target("placement p95 / round-robin p95",
                   a["p95_s"] / b["p95_s"] if a["p95_s"] and b["p95_s"] else None, 1.0, "<="),
        ],
    }


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of one policy pooled: every request's latency, all the wall time."""
    lat = [x[3] for r in runs for x in r["trace"]]
    wall = sum(r["wall_s"] for r in runs)
    return {"cold_loads": sum(r["cold_loads"] for r in runs),
            "requests": sum(r["requests"] for r in runs),
            "n_errors": sum(r["n_errors"] for r in runs),
            "p50_s": percentile(lat, 50), "p95_s": percentile(lat, 95),
            "rps": sum(r["requests"] for r in runs) / wall if wall else None}


def _wait_up(url: str, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            doc = httpx.get(f"{url}/cluster/ps", timeout=10).json()
            if doc.get("nodes") and all(n.get("up") for n in doc["nodes"]):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the cluster ingress at {url} did not come up")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="fewer requests, one round")
    ap.add_argument("--rounds", type=int, default=None, help="A B / B A rounds (default 2)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=None, help="per client per phase")
    ap.add_argument("--temperature", type=float, default=0.8,
                    help="0: greedy requests, which a daemon runs one at a time per model")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    harness.compile_bytecode()
    rounds = a.rounds or (1 if a.smoke else 2)
    per_client = a.requests or (4 if a.smoke else 15)
    ctx = Context(smoke=a.smoke, rounds=rounds, out_dir=a.out, model=Path(),
                  threads=os.cpu_count() or 2)
    started, load0 = time.monotonic(), harness.loadavg()
    data = cluster_bench(ctx, a.clients, per_client, a.temperature)
    harness.print_targets(data, write_result(ctx, "cluster", data, started, load0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Concurrency benchmark (8): 8 clients over 2 models, every reply checked.

Each client is a thread with its own :class:`modeld.client.Client` (one DEALER socket each,
as separate processes would have). References are computed first, one request at a time;
then all clients run at once and every reply must equal its reference (greedy decoding is
deterministic). Reported: throughput (completion tokens/s and requests/s over the wall time
of the concurrent phase), p50/p99 request latency, and the same load run sequentially by one
client for comparison.

Greedy replies must not depend on what ran before on the runner (llama.cpp's logits depend on
the decode batch split; greedy prompts are evaluated in aligned pieces, generation.py): the
reference phase also sends each prompt after each other prompt and counts the distinct replies.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from harness import Context, Daemon, percentile, target

PROMPTS = ("The history of the lighthouse", "A recipe for bread", "Why the sky is blue",
           "The rules of chess")  # fmt: skip
MAX_TOKENS = 16


def _one(client: Any, model: Path, prompt: str) -> tuple[str, int, float]:
    t = time.perf_counter()
    gen = client.generate(str(model), prompt, raw=True, max_tokens=MAX_TOKENS,
                          temperature=0.0, seed=0)
    text = gen.text()
    assert gen.done is not None
    return text, int(gen.done["usage"]["completion_tokens"]), time.perf_counter() - t


def concurrency(ctx: Context, d: Daemon, models: list[Path], clients: int = 8,
                per_client: int | None = None) -> dict[str, Any]:
    per_client = per_client or max(2, ctx.rounds)
    c0 = d.client()
    for m in models:
        c0.load(str(m))
    plan = [[(models[(i + j) % len(models)], PROMPTS[(i * per_client + j) % len(PROMPTS)])
             for j in range(per_client)] for i in range(clients)]
    reference: dict[tuple[str, str], str] = {}
    seen: dict[tuple[str, str], set[str]] = {}  # replies one client gets after any other prompt
    for m in models:
        for p in PROMPTS:
            reference[(str(m), p)] = _one(c0, m, p)[0]
        for before in PROMPTS:
            for p in PROMPTS:
                _one(c0, m, before)
                seen.setdefault((str(m), p), set()).add(_one(c0, m, p)[0])
    # the same requests one at a time, for comparison
    t0 = time.perf_counter()
    seq_tokens = 0
    for jobs in plan:
        for m, p in jobs:
            seq_tokens += _one(c0, m, p)[1]
    seq_wall = time.perf_counter() - t0

    results: list[list[tuple[str, str, str, int, float]]] = [[] for _ in range(clients)]
    errors: list[str] = []
    start = threading.Barrier(clients + 1)

    def worker(i: int) -> None:
        client = d.client()
        try:
            start.wait()
            for m, p in plan[i]:
                text, n, dt = _one(client, m, p)
                results[i].append((str(m), p, text, n, dt))
        except Exception as exc:  # recorded, and the benchmark fails its check
            errors.append(f"client {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    flat = [r for rs in results for r in rs]
    mismatches = [f"{m.rsplit('/', 1)[-1]} {p!r}: {text!r} != {reference[(m, p)]!r}"
                  for m, p, text, _, _ in flat if text != reference[(m, p)]]
    lat = [r[4] for r in flat]
    tokens = sum(r[3] for r in flat)
    expected = clients * per_client
    return {
        "title": "Concurrency",
        "what": f"{clients} clients (threads, one socket each), {per_client} requests each, "
        f"alternating over {len(models)} models; raw {MAX_TOKENS}-token greedy completions",
        "models": [m.name for m in models],
        "requests": len(flat),
        "expected_requests": expected,
        "errors": errors,
        "mismatches": mismatches[:20],
        "mismatch_count": len(mismatches),
        "variants_per_prompt": {
            f"{m.rsplit('/', 1)[-1]} {p}": len(v) for (m, p), v in seen.items()
        },
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall if wall else None,
        "requests_per_s": len(flat) / wall if wall else None,
        "latency_p50_s": percentile(lat, 50),
        "latency_p99_s": percentile(lat, 99),
        "sequential_wall_s": seq_wall,
        "sequential_tokens_per_s": seq_tokens / seq_wall if seq_wall else None,
        "speedup_vs_sequential": seq_wall / wall if wall else None,
        "targets": [
            target("replies correct (all equal their reference)",
                   1.0 if not mismatches and not errors and len(flat) == expected else 0.0,
                   1.0, ">="),
            target("distinct greedy replies per prompt, after any other prompt",
                   max((len(v) for v in seen.values()), default=0), 1, "<="),
        ],
    }

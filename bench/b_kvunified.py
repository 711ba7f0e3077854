"""One pool of KV cells shared by the sequences (issue 36, ``kv_unified``) against a stream per
sequence, parallel 4, prompt cache off.

Memory: the model loaded with ``--ctx N --parallel 4`` separate (4 x N cells), shared (N cells)
and shared at 4N (the same cells as separate); one greedy request each (a full batch), then the
``ps`` row's estimate against the runner's measured peak RSS. Targets: the shared pool's
estimate within 10% of the measurement, and the shared N pool below the separate layout.

A long conversation beside short requests: the same cells either way (a quarter of them per
sequence, or one pool), a prompt longer than a separate share sent with 3 short requests at once;
the separate layout grows the context for it (a reload), the pool serves it as it is. Reported:
the long request's time to its last token and the short ones' median, each layout.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from harness import Context, daemon, generated, target


def _memory(d: Any, model: str, n_ctx: int, unified: bool) -> dict[str, Any]:
    c = d.client(timeout=600)
    c.load(model, n_ctx=n_ctx, parallel=4, kv_unified=unified)
    prompt = " ".join(f"the quick brown fox {i} jumps" for i in range(120))  # > one batch
    for _ in c.generate(model, prompt, raw=True, max_tokens=8, temperature=0):
        pass
    (row,) = [r for r in c.ps() if r["state"] != "unloading"]
    assert row["kv_unified"] is unified, row
    est, meas = int(row["estimate_bytes"]), int(row["measured_bytes"])
    return {"layout": "shared" if unified else "separate", "n_ctx": row["n_ctx"], "parallel": 4,
            "estimate_bytes": est, "measured_bytes": meas, "error": (meas - est) / est}


def _mixed(d: Any, model: str, pool: int, unified: bool, long_words: int) -> dict[str, Any]:
    """One long prompt and 3 short requests sent at once; their wall times."""
    c = d.client(timeout=600)
    c.load(model, n_ctx=pool if unified else pool // 4, parallel=4, kv_unified=unified)
    times: dict[str, float] = {}
    done: dict[str, Any] = {}

    def one(name: str, prompt: str, max_tokens: int) -> None:
        t0 = time.perf_counter()
        g = d.client(timeout=600).generate(model, prompt, raw=True, max_tokens=max_tokens,
                                           temperature=0, deterministic=False)  # fmt: skip
        for _ in g:
            pass
        times[name], done[name] = time.perf_counter() - t0, g.done

    long_prompt = " ".join(f"stone river {i}" for i in range(long_words))
    jobs = [threading.Thread(target=one, args=("long", long_prompt, 32))]
    jobs += [threading.Thread(target=one, args=(f"short{i}", f"question {i} about the sea", 64))
             for i in range(3)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(600)
    return {"layout": "shared" if unified else "separate", "pool_cells": pool,
            "long_prompt_tokens": done["long"]["usage"]["prompt_tokens"],
            "long_s": times["long"], "long_n_ctx": done["long"]["n_ctx"],
            "short_median_s": statistics.median(times[f"short{i}"] for i in range(3)),
            "reloads": c.stats()["evictions"]["reload"]}


def kv_unified(ctx: Context) -> dict[str, Any]:
    model, n_ctx, pool, words = ctx.model, 4096, 8192, 900
    if ctx.smoke:
        model = generated("llama", n_layer=2, n_embd=128, n_head=4, n_ff=256, n_vocab=512,
                          context_length=16384, dtype="f32")  # fmt: skip
        n_ctx, pool, words = 2048, 4096, 120
    rows: list[dict[str, Any]] = []
    mixed: list[dict[str, Any]] = []
    with daemon("--prompt-cache-mib", "0") as d:
        for n, unified in ((n_ctx, False), (n_ctx, True), (4 * n_ctx, True)):
            rows.append(_memory(d, str(model), n, unified))
            r = rows[-1]
            ctx.log(f"   {r['layout']} n_ctx {r['n_ctx']} (asked {n}) x4: measured "
                    f"{r['measured_bytes'] >> 20} MiB, estimate {r['estimate_bytes'] >> 20} "
                    f"MiB, error {r['error']:+.3f}")
    for unified in (False, True):
        with daemon("--prompt-cache-mib", "0") as d:
            mixed.append(_mixed(d, str(model), pool, unified, words))
            ctx.log(f"   mixed {mixed[-1]}")
    shared, separate = rows[1], rows[0]
    targets = [target(f"abs error shared n_ctx {r['n_ctx']}", abs(r["error"]), 0.10, "<=")
               for r in rows if r["layout"] == "shared"]
    targets.append(target("shared / separate measured at the same n_ctx",
                          shared["measured_bytes"] / separate["measured_bytes"], 1.0, "<="))
    return {
        "title": "One KV pool shared by the sequences (kv_unified) vs a stream each",
        "what": f"{model.name}, parallel 4, prompt cache off: estimate vs measured RSS for "
        f"n_ctx {n_ctx} separate, {n_ctx} shared and {4 * n_ctx} shared; then a long prompt "
        f"({words} numbered phrases) sent with 3 short requests at once, {pool} cells either way "
        f"({pool // 4} x 4 separate: the long one grows the context; one pool of {pool})",
        "model": model.name,
        "rounds": 1,
        "rows": rows,
        "mixed": mixed,
        "targets": targets,
    }

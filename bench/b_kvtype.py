"""KV cache types on the CPU (issue 34): modeld's estimate against what the runner measures.

One daemon (prompt cache off, so nothing but the model is charged), the default model
(gemma-3-270m Q4_K_M: 256-wide heads, so q8_0 and q4_0 are allowed) loaded with ``--ctx N
--parallel 1 --kv-cache-type T`` for T in f16, q8_0, q4_0 and two contexts; each load is used
by one greedy request whose prompt (~700 tokens) fills a whole 512-token batch (the compute
pages the estimate counts are then touched, as they are in use), then its ``ps`` row is read:
``estimate_bytes`` (the reservation: the estimate and the runner baseline) and
``measured_bytes`` (the runner's peak RSS, the figure the cache then charges). Reported per
row: the error (measured - estimate) / estimate, and the memory a quantized cache saves
against f16, measured and estimated. Targets: every quantized row's estimate within 10% of the
measurement, and the measured saving at the larger context at least 80% of the estimated one.
"""

from __future__ import annotations

from typing import Any

from harness import Context, daemon, generated, target

TYPES = ("f16", "q8_0", "q4_0")


def _measure(d: Any, model: str, n_ctx: int, kv: str) -> dict[str, Any]:
    c = d.client(timeout=600)
    c.load(model, n_ctx=n_ctx, parallel=1, kv_cache_type=kv)
    prompt = " ".join(f"the quick brown fox {i} jumps" for i in range(120))  # > one batch
    g = c.generate(model, prompt, raw=True, max_tokens=8, temperature=0)
    for _ in g:
        pass
    (row,) = [r for r in c.ps() if r["state"] != "unloading"]
    assert row["kv_cache_type"] == kv and row["n_ctx"] == n_ctx, row
    est, meas = int(row["estimate_bytes"]), int(row["measured_bytes"])
    return {"kv_cache_type": kv, "n_ctx": n_ctx, "estimate_bytes": est, "measured_bytes": meas,
            "error": (meas - est) / est}


def kv_cache_type(ctx: Context) -> dict[str, Any]:
    model = ctx.model
    contexts: tuple[int, ...] = (8192, 32768)
    if ctx.smoke:  # a tiny model whose heads are 32 wide (the quantized types need that)
        model = generated("llama", n_layer=2, n_embd=128, n_head=4, n_ff=256, n_vocab=512,
                          context_length=4096, dtype="f32")  # fmt: skip
        contexts = (1024, 4096)
    rows: list[dict[str, Any]] = []
    with daemon("--prompt-cache-mib", "0") as d:
        for n_ctx in contexts:
            for kv in TYPES:
                rows.append(_measure(d, str(model), n_ctx, kv))
                ctx.log(f"   n_ctx {n_ctx} {kv}: measured {rows[-1]['measured_bytes'] >> 20} "
                        f"MiB, estimate {rows[-1]['estimate_bytes'] >> 20} MiB, error "
                        f"{rows[-1]['error']:+.3f}")
    f16 = {r["n_ctx"]: r for r in rows if r["kv_cache_type"] == "f16"}
    for r in rows:
        base = f16[r["n_ctx"]]
        r["saved_measured"] = base["measured_bytes"] - r["measured_bytes"]
        r["saved_estimated"] = base["estimate_bytes"] - r["estimate_bytes"]
    big = contexts[-1]
    targets = [target(f"abs error {r['kv_cache_type']} at n_ctx {r['n_ctx']}", abs(r["error"]),
                      0.10, "<=") for r in rows if r["kv_cache_type"] != "f16"]
    for r in rows:
        if r["n_ctx"] == big and r["kv_cache_type"] != "f16" and r["saved_estimated"] > 0:
            targets.append(target(f"saving measured / estimated, {r['kv_cache_type']} at "
                                  f"n_ctx {big}", r["saved_measured"] / r["saved_estimated"],
                                  0.8, ">="))  # fmt: skip
    return {
        "title": "KV cache types on the CPU: estimate vs measured",
        "what": f"{model.name} loaded with --kv-cache-type f16/q8_0/q4_0 at n_ctx "
        f"{' and '.join(map(str, contexts))} (parallel 1, prompt cache off), one greedy request "
        "each (~700 prompt tokens: a full batch); the ps row's estimate (the reservation) "
        "against the runner's measured peak RSS, and the memory a quantized cache saves "
        "against f16",
        "model": model.name,
        "rounds": 1,  # one load per row: RSS is not timing noise
        "rows": rows,
        "targets": targets,
    }

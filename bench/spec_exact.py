"""Does verifying draft tokens in one decode call change greedy logits? (issue 46)

Speculative decoding checks k drafted tokens with one ``llama_decode`` of k + 1 rows of one
sequence; the plain decode evaluates them one row at a time. modeld's greedy replies must not
change, so this measures, on a model loaded exactly as the runner loads it
(``llamaopen.open_llama``), whether each row's logits of a verification call equal the logits
of the one-row decode at the same position — bit for bit, and by argmax.

For each ``parallel`` (1: repacked weights; 4: not repacked, a KV stream per sequence) it
generates a greedy reference one token a call (with the lone-sequence pad row of
runner/microbatch.py when ``parallel`` > 1, as the runner decodes it), then for every draft
length k replays the same positions as verification calls of k + 1 rows holding the reference's
own next tokens (a perfect draft: the case where rows must agree), and counts rows whose logits
differ.

    .venv/bin/python bench/spec_exact.py [--model PATH] [--tokens 160] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from harness import machine  # bench/ is on sys.path when run as a script

from modeld.runner import llamaopen, microbatch
from modeld.runner.generation import DecodeBatch
from modeld.runner.specs import LoadSpec

PROMPT = ("Here is a Python function:\n\ndef area(width, height):\n    return width * height\n\n"
          "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
          "Rewrite both functions with the argument names w and h:\n\n")


FILLER = ("The quick brown fox jumps over the lazy dog while the committee reviews the quarterly "
          "report on regional water usage, noting that rainfall was below average. ")


def _logits(llm: llama_cpp.Llama, index: int) -> np.ndarray[Any, Any]:
    n_vocab = llm.n_vocab()
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, index)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()


def _clear(llm: llama_cpp.Llama, seq: int, start: int) -> None:
    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llm._ctx.ctx), seq, start, -1)


def _prefill(llm: llama_cpp.Llama, batch: DecodeBatch, tokens: list[int]) -> np.ndarray[Any, Any]:
    """The prompt in aligned 128-token pieces, as the runner evaluates a greedy prompt."""
    index = 0
    for start in range(0, len(tokens), 128):
        piece = tokens[start:start + 128]
        for pos, tok in enumerate(piece, start):
            index = batch.add(tok, pos, 0, pos == len(tokens) - 1)
        batch.decode()
    return _logits(llm, index)


def _reference(llm: llama_cpp.Llama, batch: DecodeBatch, prompt: list[int], n: int,
               pad: bool) -> tuple[list[int], list[np.ndarray[Any, Any]]]:
    """Greedy tokens one a call; rows[i] are the logits that chose token i."""
    _clear(llm, 0, 0)
    rows = [_prefill(llm, batch, prompt)]
    out: list[int] = []
    pos = len(prompt)
    for _ in range(n):
        tok = int(np.argmax(rows[-1]))
        out.append(tok)
        index = batch.add(tok, pos, 0, True)
        if pad and microbatch.needs_pad(True, pos):
            batch.add(tok, pos + 1, 0, False)
        batch.decode()
        _clear(llm, 0, pos + 1)
        rows.append(_logits(llm, index))
        pos += 1
    return out, rows


def _verify(llm: llama_cpp.Llama, batch: DecodeBatch, prompt: list[int], ref: list[int],
            rows: list[np.ndarray[Any, Any]], k: int) -> dict[str, int]:
    """Replay the reference with verification calls of k + 1 rows (the last accepted token and
    k drafted ones, all the reference's own); count rows that differ from the one-row decode."""
    _clear(llm, 0, 0)
    _prefill(llm, batch, prompt)
    n = len(ref)
    counts = {"rows": 0, "bits_differ": 0, "argmax_differ": 0}
    i = 0  # ref[i] is the next token to feed; rows[i + 1] its reference logits
    while i + k + 1 <= n:
        indices = [batch.add(ref[i + j], len(prompt) + i + j, 0, True) for j in range(k + 1)]
        batch.decode()
        for j, index in enumerate(indices):
            got, want = _logits(llm, index), rows[i + j + 1]
            counts["rows"] += 1
            counts["bits_differ"] += int(not np.array_equal(got, want))
            counts["argmax_differ"] += int(int(np.argmax(got)) != int(np.argmax(want)))
        i += k + 1
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF file (default: the built-in default model)")
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--lead", type=int, default=0,
                    help="repeat a filler paragraph before the prompt this many times (positions "
                    "past 512 take llama.cpp's split attention for one query row)")
    ap.add_argument("--drafts", default="1,2,3,4,6", help="draft lengths k to replay")
    ap.add_argument("--parallel", default="1,4")
    ap.add_argument("--out", type=Path, default=Path("bench/results/spec_exact.json"))
    args = ap.parse_args()
    if args.model is None:
        from modeld.registry import default_model
        args.model = str(default_model().path)
    results: list[dict[str, Any]] = []
    for parallel in (int(p) for p in args.parallel.split(",")):
        spec = LoadSpec(path=args.model, n_ctx=2048, n_threads=args.threads, parallel=parallel,
                        warm_up=False)
        llm = llamaopen.open_llama(spec, 512)
        batch = DecodeBatch(llm)
        text = FILLER * args.lead + PROMPT
        prompt = llm.tokenize(text.encode(), add_bos=True, special=False)
        t0 = time.perf_counter()
        ref, rows = _reference(llm, batch, prompt, args.tokens, pad=parallel > 1)
        for k in (int(k) for k in args.drafts.split(",")):
            row = {"parallel": parallel, "k": k, "prompt_tokens": len(prompt),
                   **_verify(llm, batch, prompt, ref, rows, k)}
            results.append(row)
            print(json.dumps(row), flush=True)
        print(f"parallel {parallel}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        del llm
    doc = {"bench": "spec_exact", "model": os.path.basename(args.model),
           "machine": machine(), "threads": args.threads,
           "tokens": args.tokens, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

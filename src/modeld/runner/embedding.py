"""Embedding in the runner (embed mode): each input's vector, pooled by the model or the mean
of its per-token hidden states.

Apart from :mod:`.process` as reranking is (:mod:`.rank`): the arithmetic of one request kind,
which the runner's conversation (loading, replies, cancellation) only calls; ``check`` is the
runner's cancellation check, called between inputs and between chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import llama_cpp

from modeld.errors import InvalidRequestError
from modeld.model import memory
from modeld.runner.prepare import context_exceeded
from modeld.runner.textstream import pool_and_normalize

#: tokens per decode when embedding without pooling (model/memory.py)
EMBED_CHUNK = memory.EMBED_CHUNK


def pooled(llm: llama_cpp.Llama) -> bool:
    """Whether the model pools its token states into one vector (an embedding model's
    context), rather than leaving per-token states (a decoder's)."""
    return bool(llama_cpp.llama_pooling_type(llm._ctx.ctx) != llama_cpp.LLAMA_POOLING_TYPE_NONE)


def embed_inputs(llm: llama_cpp.Llama, inputs: Sequence[str],
                 check: Callable[[], None]) -> tuple[list[list[float]], int]:
    """The vectors of ``inputs`` and their total tokens; an empty input or one longer than the
    model takes at once is refused (InvalidRequestError, ContextExceededError)."""
    limit = min(llm.n_ctx(), llm.n_batch) if pooled(llm) else llm.n_ctx()
    vectors: list[list[float]] = []
    total = 0
    for text in inputs:
        check()
        n = len(llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))
        if n == 0:
            raise InvalidRequestError("cannot embed an empty input")
        if n > limit:
            raise context_exceeded(n, limit)
        total += n
        vectors.append(embed_one(llm, text, check))
    return vectors, total


def embed_one(llm: llama_cpp.Llama, text: str, check: Callable[[], None]) -> list[float]:
    """One input's embedding: the model's pooled vector, or the mean of its per-token
    hidden states when the model has no pooling (decoders such as Gemma).

    In embedding mode llama.cpp makes every token an output and computes its logits too:
    n_tokens x n_vocab floats, over 1 GiB for 1000 tokens of Gemma's 262k vocabulary when
    done in one batch (Llama.embed). Decoding in small chunks, with the KV cache carrying
    the prefix, gives the same states with that buffer bounded to EMBED_CHUNK rows.
    """
    if pooled(llm):
        return pool_and_normalize(llm.embed(text, truncate=False))
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    n_embd = llm.n_embd()
    total = [0.0] * n_embd
    llm._ctx.kv_cache_clear()  # type: ignore[no-untyped-call]
    try:
        for start in range(0, len(tokens), EMBED_CHUNK):
            if start:
                check()
            part = tokens[start : start + EMBED_CHUNK]
            llm._batch.set_batch(batch=part, n_past=start, logits_all=True)
            llm._ctx.decode(llm._batch)
            rows = llama_cpp.llama_get_embeddings(llm._ctx.ctx)
            for r in range(len(part)):
                row = rows[r * n_embd : (r + 1) * n_embd]
                total = [a + b for a, b in zip(total, row, strict=True)]
    finally:
        llm._ctx.kv_cache_clear()  # type: ignore[no-untyped-call]
        llm.n_tokens = 0
    return pool_and_normalize([x / len(tokens) for x in total])

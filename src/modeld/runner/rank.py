"""Reranking in the runner: score query-document pairs with a cross-encoder (rank pooling).

A reranker GGUF (a BERT-like encoder with a classification head, ``pooling_type`` rank) is
loaded like an embedding model; llama.cpp then pools each sequence into its relevance score
(the first value of ``llama_get_embeddings_seq``). A pair is tokenized as llama-server's
``format_prompt_rerank`` does: the model's "rerank" chat template when it has one, else
``[BOS] query [EOS] [SEP] document [EOS]`` with each special token only where the vocabulary
asks for it (``add_bos``/``add_eos``/``add_sep``), so both servers score the same tokens.

Pairs are batched like ``Llama.embed`` batches inputs: as many whole pairs per decode as fit
in ``n_batch`` tokens and ``n_seq_max`` sequences, one sequence id each, the KV cache cleared
between decodes (an encoder needs all of a pair in one micro-batch, and ``n_ubatch`` =
``n_batch`` = ``n_ctx`` for pooled models).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import llama_cpp

from modeld.errors import ContextExceededError, InvalidRequestError


def is_reranker(llm: llama_cpp.Llama) -> bool:
    """Whether the loaded context pools sequences into scores (rank pooling)."""
    pooling = llama_cpp.llama_pooling_type(llm._ctx.ctx)
    return bool(pooling == llama_cpp.LLAMA_POOLING_TYPE_RANK)


def pair_tokens(llm: llama_cpp.Llama, query: str, document: str) -> list[int]:
    """The tokens of one (query, document) pair, as llama-server builds them."""
    template = llama_cpp.llama_model_chat_template(llm._model.model, b"rerank")
    if template:
        text = template.decode("utf-8", errors="replace")
        text = text.replace("{query}", query).replace("{document}", document)
        return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))
    vocab = llm._model.vocab
    eos = int(llama_cpp.llama_vocab_eos(vocab))
    if eos < 0:
        eos = int(llama_cpp.llama_vocab_sep(vocab))
    add_eos = bool(llama_cpp.llama_vocab_get_add_eos(vocab))
    out: list[int] = []
    if llama_cpp.llama_vocab_get_add_bos(vocab):
        out.append(int(llama_cpp.llama_vocab_bos(vocab)))
    out += llm.tokenize(query.encode("utf-8"), add_bos=False, special=False)
    if add_eos:
        out.append(eos)
    if llama_cpp.llama_vocab_get_add_sep(vocab):
        out.append(int(llama_cpp.llama_vocab_sep(vocab)))
    out += llm.tokenize(document.encode("utf-8"), add_bos=False, special=False)
    if add_eos:
        out.append(eos)
    return out


def check_pairs(pairs: Sequence[Sequence[int]], limit: int) -> int:
    """The pairs' total token count; ContextExceededError for the first pair longer than the
    context (query + that document must fit one sequence)."""
    for i, pair in enumerate(pairs):
        if len(pair) > limit:
            raise ContextExceededError(
                f"query + document {i} are {len(pair)} tokens but the loaded context holds "
                f"{limit}",
                hint="shorten the query or the document, or load the model with a larger n_ctx",
                details={"prompt_tokens": len(pair), "n_ctx": limit, "document": i},
            )
    if not any(pairs):
        raise InvalidRequestError("nothing to rerank")
    return sum(len(p) for p in pairs)


def score_pairs(
    llm: llama_cpp.Llama, pairs: Sequence[Sequence[int]], between: Callable[[], None]
) -> list[float]:
    """One relevance score per pair, in order; ``between`` runs between decodes (cancel)."""
    ctx = llm._ctx.ctx
    n_batch = min(int(llm.n_batch), int(llm.n_ctx()))
    n_seq_max = int(llama_cpp.llama_n_seq_max(ctx))
    batch = llm._batch.batch
    memory = llama_cpp.llama_get_memory(ctx)
    scores: list[float] = []
    start = 0
    while start < len(pairs):
        if start:
            between()
        end, used = start, 0
        while end < len(pairs) and end - start < n_seq_max and used + len(pairs[end]) <= n_batch:
            used += len(pairs[end])
            end += 1
        if end == start:  # check_pairs keeps every pair within the batch
            raise ContextExceededError(f"pair {start} does not fit a batch of {n_batch}")
        n = 0
        for seq, pair in enumerate(pairs[start:end]):
            for pos, token in enumerate(pair):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = token, pos, 1
                batch.seq_id[n][0], batch.logits[n] = seq, True
                n += 1
        batch.n_tokens = n
        llama_cpp.llama_memory_clear(memory, True)
        try:
            llm._ctx.decode(llm._batch)
            for seq in range(end - start):
                row = llama_cpp.llama_get_embeddings_seq(ctx, seq)
                if not row:
                    raise RuntimeError(f"llama.cpp returned no score for pair {start + seq}")
                scores.append(float(row[0]))
        finally:
            llama_cpp.llama_memory_clear(memory, True)
        start = end
    return scores

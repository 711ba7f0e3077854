"""Drafted tokens in a sequence's decode call, and the prefix of them the model agrees with.

Why the text stays the same: :mod:`modeld.runner.speculate`. Here: which sequences draft in a
step (:func:`drafts`), and after the call, sampling row after row as plain decodes would
(:func:`accept`): a row counts while the token sampled from the row before it equals the
draft token it holds; the cells of the rows after the first disagreement are removed, so the
sequence's cells are exactly its tokens again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import llama_cpp

from modeld.runner import microbatch, speculate
from modeld.runner.stream import Stream


class Engine(Protocol):
    """What drafting needs of the batch engine (runner/batch.py)."""

    llm: llama_cpp.Llama
    invariant: bool
    n_ctx_seq: int

    def sample(self, stream: Stream, index: int) -> int: ...

    def sampled(self, stream: Stream, token: int) -> None: ...


#: Cells a draft leaves free at the end of a sequence: its next token, one spare (the rule of
#: batch.py's ``sampled``) and the token sampled from the last row.
_END_MARGIN = 3


def drafts(engine: Engine, streaming: Sequence[Stream]) -> dict[int, list[int]]:
    """Sequence id -> the tokens it drafts in this step (none where drafting is off, paused or
    finds nothing). Only where decode calls are shaped for batch invariance (there a row of a
    verification call equals the one-row decode's, bit for bit: speculate.py), and only for a
    sequence decoding alone: beside others its rows would cost a weight pass of their own
    (llama.cpp gives each micro-batch equal tokens per sequence), which pays only when more
    draft tokens are taken than there are sequences, and the step's tokens already come from
    the batch."""
    out: dict[int, list[int]] = {}
    if not engine.invariant or len(streaming) != 1:
        return out
    for stream in streaming:
        k_max = min(stream.spec.sampling.draft_max, microbatch.MAX_ROWS - 1)
        if k_max <= 0 or stream.next_token is None:
            continue
        if stream.drafter is None:
            stream.drafter = speculate.Drafter(k_max)
        tokens = stream.state.tokens
        limit = engine.n_ctx_seq - len(tokens) - _END_MARGIN
        draft = stream.drafter.draft([*tokens, stream.next_token], limit)
        if draft:
            out[stream.seq] = draft
    return out


def accept(engine: Engine, stream: Stream, index: int, draft: Sequence[int]) -> None:
    """Sample rows ``index`` .. ``index + len(draft)`` of the last decode in order (row j holds
    the logits after ``draft[j - 1]``), keeping each draft token the row before it chose; the
    first token that differs (or the last row's) is the stream's next token, as after a plain
    decode."""
    assert stream.drafter is not None
    base = len(stream.state.tokens)  # draft[0]'s position
    taken = 0
    for j in range(len(draft) + 1):
        token = engine.sample(stream, index + j)
        agrees = j < len(draft) and token == draft[j]
        if not agrees:
            _drop(engine, stream, base + j)
        engine.sampled(stream, token)
        if not agrees:
            break
        if stream.next_token is None:  # it ended on this token: its cell is not its own
            _drop(engine, stream, base + j)
            break
        stream.next_token = None  # evaluated already, in this call
        stream.state.decoded(token)
        taken += 1
    stream.drafter.record(len(draft), taken)


def _drop(engine: Engine, stream: Stream, start: int) -> None:
    """Remove the sequence's cells from position ``start`` on (drafts not taken)."""
    memory = llama_cpp.llama_get_memory(engine.llm._ctx.ctx)
    llama_cpp.llama_memory_seq_rm(memory, stream.seq, start, -1)

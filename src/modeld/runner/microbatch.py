"""The shapes of a decode step that keep a greedy reply independent of the batch (issue 26).

llama.cpp's CPU backend gives a sequence other logits when other sequences share its decode
call in three ways (measured: bench/invariance.py, docs/benchmarks.md):

- repacked weights (Q4_K, Q4_0, IQ4_NL on x86): micro-batch rows are computed four at a time
  by one kernel and the rest by another, so a row's result depends on its place in the batch.
  The runner loads without them (``use_extra_bufts`` false) when it decodes several sequences;
- ggml-cpu's tiled K-quant matmul, taken for micro-batches of 8 rows or more (fewer use the
  per-row dot products, which add the same products up in another order): the decode tokens
  of a step go in calls of at most :data:`MAX_ROWS` rows while it is on (prompts, evaluated
  alone in pieces of the same size either way, keep the tiled path); a runner decoding 8
  sequences or more turns it off instead (runner/llamaopen.py) and makes one call;
- flash attention over one query row of one KV stream with 512 cells or more splits the cells
  among the threads and adds the parts up in another order: a sequence alone in its
  micro-batch gets a second query row (its next position, dropped after the call), so it is
  always computed as it is beside others. llama.cpp views ``max(256, used cells rounded up to
  256)`` cells, and a sequence's cells are its positions, in order, from the first cell of its
  stream (a shorter prompt truncates the cells after it; a sliding-window cache that wrapped is
  never truncated to fewer than its window: generation.PromptState._truncate), so below
  :data:`PAD_FROM` positions the view is 256 cells and the second row is left out: it costs
  11% of a lone sequence's decode rate (bench/invariance.py, docs/benchmarks.md).

Everything here is pure: which sequences share a call, given the streaming sequence ids.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Rows of one decode micro-batch at most: ggml-cpu's tiled matmul starts at 8 (unless the
#: process has it off: ``GGML_CPU_TILED_MM=0``, set by the runner for ``parallel`` 8 or more,
#: then any number: runner/llamaopen.py).
MAX_ROWS = 7
#: A sequence alone in its micro-batch holding this many positions or more gets the second
#: query row (half of the 256 cells below which attention is never split: a margin).
PAD_FROM = 128


def needs_pad(alone: bool, positions: int) -> bool:
    """Whether a sequence holding ``positions`` gets a second query row in its decode call."""
    return alone and positions >= PAD_FROM


def runs(seqs: Sequence[int]) -> list[list[int]]:
    """Sorted sequence ids cut into runs of consecutive ids: llama.cpp makes each run one
    micro-batch (a KV stream per sequence: ``split_equal`` takes increasing ids only)."""
    out: list[list[int]] = []
    for seq in sorted(seqs):
        if out and out[-1][-1] == seq - 1:
            out[-1].append(seq)
        else:
            out.append([seq])
    return out


def decode_calls(seqs: Sequence[int], max_rows: int = MAX_ROWS) -> list[list[int]]:
    """The decode calls of one step: each run of consecutive ids cut into the fewest parts of
    at most ``max_rows`` sequences, as even as possible (8 -> 4 + 4, not 7 + 1: a part of one
    sequence costs a padding row)."""
    if max_rows < 1:
        raise ValueError("max_rows must be at least 1")
    calls: list[list[int]] = []
    for run in runs(seqs):
        parts = -(-len(run) // max_rows)
        size, extra = divmod(len(run), parts)
        start = 0
        for i in range(parts):
            end = start + size + (1 if i < extra else 0)
            calls.append(run[start:end])
            start = end
    return calls

"""Draft-free speculative decoding: drafts looked up in the sequence's own tokens (issue 46).

An agent's reply often repeats what its context holds (a file rewritten with one change, a
record echoed with a field added). When the last few tokens occurred before, the tokens that
followed them then are a likely continuation: the runner feeds them as extra rows of the
sequence's next decode call and keeps the agreeing prefix (prompt lookup; llama.cpp's n-gram
self-speculation, vLLM's ngram proposer, mlx-lm's prompt lookup).

Exactness: every row is sampled in order from its own logits, as a plain decode would sample
it, and a draft token counts only when it equals that sample; so a draft is a point-mass
proposal and the speculative-sampling accept rule reduces to this comparison (a sampled
request keeps its distribution, and with the same seed its very tokens). Greedy text stays
the same when the rows' logits equal the one-row decode's: measured (bench/spec_exact.py) on
loads whose decode is already shaped for batch invariance (runner/microbatch.py: no repacked
weights, a KV stream per sequence, at most :data:`microbatch.MAX_ROWS` rows a call, never one
lone query row): 0 of 474 rows differ. Elsewhere (``parallel`` 1: repacked weights and a lone
row's split attention past 512 cells) rows differ in their last bits, so drafting is off there.

Pure: no native imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

#: Longest and shortest suffix looked up (longer matches first: they predict better).
NGRAM_MAX = 4
NGRAM_MIN = 2
#: Most positions indexed in one step when a long prompt is first looked up: the index is
#: built from the newest tokens back, a bounded part a step, so a 40k-token prompt never
#: stalls the other sequences' step for long (~1 ms a 1,000 positions).
INDEX_STEP = 4096
#: After this many drafts in a row with nothing accepted, drafting pauses for a number of
#: steps that doubles with each such run (up to :data:`MAX_PAUSE`): fresh prose costs nothing.
MISSES_BEFORE_PAUSE = 2
MAX_PAUSE = 64


@dataclass
class Counts:
    """What a request's drafting did (the reply's timings, the runner's ``stats``)."""

    drafted: int = 0  # draft tokens fed for verification
    accepted: int = 0  # of which the model agreed with (tokens saved: steps not taken)
    steps: int = 0  # decode steps with a draft

    def add(self, other: Counts) -> None:
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.steps += other.steps

    def as_dict(self) -> dict[str, int]:
        return {"draft_tokens": self.drafted, "draft_accepted": self.accepted,
                "draft_steps": self.steps}


@dataclass
class Drafter:
    """One sequence's n-gram lookup over its tokens (prompt and reply so far), with a draft
    length that follows the acceptance: one longer after a draft accepted whole, shorter after
    one mostly rejected, and paused while drafts are not accepted at all."""

    k_max: int
    k: int = 0
    counts: Counts = field(default_factory=Counts)
    # n -> n-gram -> the position right after its latest occurrence
    _index: dict[int, dict[tuple[int, ...], int]] = field(default_factory=dict)
    _hi: int = 0  # positions < _hi (and >= _lo) are indexed
    _lo: int = 0
    _misses: int = 0
    _pause: int = 0
    _paused_for: int = 0

    def __post_init__(self) -> None:
        self.k = max(0, min(self.k or self.k_max, self.k_max))
        self._index = {n: {} for n in range(NGRAM_MIN, NGRAM_MAX + 1)}

    def draft(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Up to ``min(k, limit)`` tokens likely to follow ``tokens`` (the sequence so far,
        its next token included); none while paused or when the suffix was not seen before."""
        if self._pause > 0:
            self._pause -= 1
            return []
        want = min(self.k, limit)
        if want <= 0 or len(tokens) <= NGRAM_MIN:
            return []
        self._extend(tokens)
        end = len(tokens)
        for n in range(min(NGRAM_MAX, end - 1), NGRAM_MIN - 1, -1):
            after = self._index[n].get(tuple(tokens[end - n:end]))
            if after is not None:
                return list(tokens[after:min(after + want, end)])
        return []

    def record(self, drafted: int, accepted: int) -> None:
        """The outcome of one verified draft: adapt the length, pause while nothing is taken."""
        if drafted <= 0:
            return
        self.counts.drafted += drafted
        self.counts.accepted += accepted
        self.counts.steps += 1
        if accepted == drafted:
            self.k = min(self.k + 1, self.k_max)
        elif accepted * 2 < drafted:
            self.k = max(1, self.k - 1)
        if accepted:
            self._misses, self._paused_for = 0, 0
            return
        self._misses += 1
        if self._misses >= MISSES_BEFORE_PAUSE:
            self._paused_for = min(MAX_PAUSE, max(1, self._paused_for * 2))
            self._pause, self._misses = self._paused_for, 0

    def _extend(self, tokens: Sequence[int]) -> None:
        """Index the n-grams that end before the last position: new positions forward (a later
        occurrence replaces an earlier one), older ones backward a bounded part a step (an
        occurrence already indexed is newer and stays)."""
        end = len(tokens) - 1  # the suffix itself (ending at len(tokens)) is what is looked up
        if self._hi == 0:
            self._hi = self._lo = max(end, NGRAM_MIN)
        for after in range(self._hi, end + 1):
            for n, table in self._index.items():
                if after >= n:
                    table[tuple(tokens[after - n:after])] = after
        self._hi = max(self._hi, end + 1)
        stop = max(NGRAM_MIN, self._lo - INDEX_STEP)
        for after in range(self._lo - 1, stop - 1, -1):
            for n, table in self._index.items():
                if after >= n:
                    table.setdefault(tuple(tokens[after - n:after]), after)
        self._lo = min(self._lo, stop)

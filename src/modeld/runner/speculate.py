"""Draft-free speculative decoding: drafts looked up in the sequence's own tokens (issue 46).

An agent's reply often repeats what its context holds (a file rewritten with one change, a
record echoed with a field added). When the last few tokens occurred before, the tokens that
followed them then are a likely continuation: the runner feeds them as extra rows of the
sequence's next decode call and keeps the agreeing prefix (prompt lookup; llama.cpp's n-gram
self-speculation, vLLM's ngram proposer, mlx-lm's prompt lookup).

Exactness: every row is sampled in order from its own logits, as a plain decode would sample
it, and a draft token counts only when it equals that sample; so a draft is a point-mass
proposal and the speculative-sampling accept rule reduces to this comparison: a sampled
request keeps its distribution. Greedy text stays the same when the rows' logits equal the
one-row decode's: measured (bench/spec_exact.py) on loads whose greedy decode is shaped for
batch invariance (runner/microbatch.py: no repacked weights, a KV stream per sequence, at most
:data:`microbatch.MAX_ROWS` rows a call, never one lone query row): 0 of 474 rows differ.
Elsewhere (``parallel`` 1: repacked weights, and a lone row's split attention past 512 cells)
rows differ in their last bits, so drafting is off there. A sampled sequence decoding alone is
not padded (its step is not shaped for invariance), so past 512 cells the same seed may draw
the other side of a near-tie with drafts than without (bench/spec_speed.py: 2 of 8 sampled
replies); its distribution is the model's either way.

Pure: no native imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

#: Longest and shortest suffix matched (the longest match wins: it predicts better, and it
#: tells apart look-alike places such as the records of a list: ``7, "name": "item-`` is 8
#: tokens, and only 8 find record 7 rather than the record written last).
NGRAM_MAX = 8
NGRAM_MIN = 2
#: Places kept per pair of tokens (the newest): a lookup compares the suffix with each.
PLACES = 32
#: Most positions indexed in one step when a long prompt is first looked up: the index is
#: built from the newest tokens back, a bounded part a step, so a 40k-token prompt never
#: stalls a step for long (~1 ms a 1,000 positions).
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
    # a pair of tokens (as one int) -> positions right after it, up to PLACES, newest last
    _index: dict[int, list[int]] = field(default_factory=dict)
    _hi: int = 0  # positions < _hi (and >= _lo) are indexed
    _lo: int = 0
    _misses: int = 0
    _pause: int = 0
    _paused_for: int = 0

    def __post_init__(self) -> None:
        self.k = max(0, min(self.k or self.k_max, self.k_max))

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
        best, best_n = -1, NGRAM_MIN - 1
        for after in reversed(self._index.get(_pair(tokens, end), ())):
            n = NGRAM_MIN  # the pair matches; how far back does the match go?
            while n < NGRAM_MAX and after > n and tokens[after - n - 1] == tokens[end - n - 1]:
                n += 1
            if n > best_n:  # the newest place wins a tie
                best, best_n = after, n
                if n == NGRAM_MAX:
                    break
        return list(tokens[best:min(best + want, end)]) if best >= 0 else []

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
        """Index the places after each pair of tokens that ends before the last position (the
        suffix ending at ``len(tokens)`` is what is looked up): new positions forward, older
        ones backward a bounded part a step; each pair keeps its :data:`PLACES` newest."""
        end = len(tokens) - 1
        if self._hi == 0:
            self._hi = self._lo = max(end, NGRAM_MIN)
        index = self._index
        for after in range(self._hi, end + 1):
            places = index.setdefault(_pair(tokens, after), [])
            places.append(after)
            if len(places) > 2 * PLACES:
                del places[:PLACES]
        self._hi = max(self._hi, end + 1)
        stop = max(NGRAM_MIN, self._lo - INDEX_STEP)
        for after in range(self._lo - 1, stop - 1, -1):
            places = index.setdefault(_pair(tokens, after), [])
            if len(places) < PLACES:
                places.insert(0, after)  # older than every place it holds
        self._lo = min(self._lo, stop)


def _pair(tokens: Sequence[int], after: int) -> int:
    """The two tokens before position ``after`` as one dict key."""
    return (tokens[after - 2] << 32) | tokens[after - 1]

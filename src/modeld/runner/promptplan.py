"""Prompt planning for a runner: what KV state to reuse, and how to split what is left (pure).

llama.cpp's CPU logits depend on how a prompt is split into decode calls (measured: logit
differences up to 1.5 for gemma-3-270m Q4_K_M, about 0.03 for a Q8_0 llama), so a greedy reply
used to depend on the request before it: llama-cpp-python reuses the longest common prefix and
evaluates the rest in ``n_batch`` pieces, so the split moved with the previous prompt. Thread
count and stale KV cells do not change the logits (checked bitwise).

A *reproducible* request (temperature 0) is therefore evaluated in pieces aligned at absolute
positions that are multiples of :data:`ALIGN` (``[0,C), [C,2C), ..., [kC,N)``), each its own
decode with logits for its last token, and reuses cached KV only up to a multiple of C that was
itself computed that way ("stable") and never past the start of the prompt's last piece
(``C*floor((N-1)/C)``). That gives bitwise-identical logits whatever ran before. Tokens produced
by decoding (batches of one) are never stable. Sampled requests (temperature > 0) keep the fast
rule: longest common prefix, ``n_batch`` pieces.

An image (issue 38) is a *span* of positions evaluated from its embeddings in one piece of its
own, never cut and never reused in part: pieces also end at every span's start and end, an
aligned cut inside an image is no cut, and reuse stops at a span's start. The boundaries of a
fresh evaluation (a :class:`Layout`: :meth:`Layout.floor_cut`, :meth:`Layout.next_cut`) are then
a function of the prompt alone, so the rule above still gives bitwise the logits of a fresh
evaluation.

A chat turn's reply starts a piece too (*marks*: the position after each occurrence of the
model's reply opening, e.g. ChatML's ``<|im_end|>\n<|im_start|>assistant\n``, :func:`turn_marks`).
The previous turn's prompt ended there, as its own last piece, so the next turn keeps all of it
and evaluates from the reply on, as llama-server does, instead of from the last multiple of C
(up to C-1 tokens again). A mark depends only on the tokens before it, so a prefix shared by
two prompts has the same boundaries in both, and the rule above holds.

Everything here works on token sequences and counts: a prompt's :class:`Layout` (built once, by
:meth:`Layout.of`) splits it into pieces, and :func:`plan` chooses what to reuse;
:mod:`modeld.runner.generation` applies a :class:`ReusePlan` to llama.cpp and
:mod:`modeld.runner.promptcache` keeps the snapshots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Alignment of reproducible prompt pieces. Cost against 512-token batches on a 1,000-token
#: prompt (2 cores): C=128 +3% (gemma-3-270m Q4_K_M) / +5% (Q8_0 llama); C=64 +28% / +20%.
#: Any C from 16 to 128 gave bitwise-identical logits for many reuse points.
ALIGN = 128

#: The shortest piece a turn mark may leave before it: a split costs the smaller piece's
#: lower throughput (C=64 pieces +28% above), so a mark just past a boundary is not one.
MIN_MARK_PIECE = 16

Piece = tuple[int, int]  # [start, end) absolute positions, one decode call
Span = tuple[int, int]  # [start, end) positions of one image (evaluated whole, in one piece)


@dataclass(frozen=True)
class Cached:
    """A KV state that could be reused: its tokens, how many leading positions are stable, and
    whether its last logits row equals a fresh aligned evaluation's (``logits_stable``).

    ``has_logits``: the logits row of ``tokens`` is available (a snapshot; never the live KV,
    whose logits belong to the last decoded token). ``cut_min``: the shortest prefix it can be
    cut to (a sliding-window cache no longer holds the cells a shorter one needs; 0: any).
    """

    tokens: Sequence[int]
    stable: int
    logits_stable: bool = False
    has_logits: bool = False
    cut_min: int = 0


#: :attr:`ReusePlan.source` of a plan that restores one of the live sequence's checkpoints.
CHECKPOINT = -2


@dataclass(frozen=True)
class ReusePlan:
    """Where a request's prompt state comes from.

    ``source``: -1 the live KV, :data:`CHECKPOINT` the live KV rewound to the checkpoint at
    ``keep`` (a sliding-window model's window cells restored), else the index of the chosen
    snapshot. ``keep``: tokens of that state kept (the rest of the prompt is evaluated).
    ``exact``: the snapshot holds the whole prompt and its logits, so nothing is evaluated.
    """

    source: int
    keep: int
    exact: bool = False


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def turn_marks(tokens: Sequence[int], marker: Sequence[int], spans: Sequence[Span] = (),
               align: int = ALIGN) -> tuple[int, ...]:  # fmt: skip
    """The positions right after each occurrence of ``marker`` (a reply's opening) in
    ``tokens``, outside images and at least :data:`MIN_MARK_PIECE` after the boundary before
    (a multiple of ``align``, an image's end or the mark before): where a fresh evaluation of
    a chat starts a piece. Each depends only on the tokens before it."""
    want = list(marker)
    if not want:
        return ()
    seq = tokens if isinstance(tokens, list) else list(tokens)
    out: list[int] = []
    at = 0
    while True:
        try:
            at = seq.index(want[0], at)
        except ValueError:
            return tuple(out)
        end = at + len(want)
        if seq[at:end] == want and not any(s < end < e for s, e in spans):
            before = max([end - end % align, *(e for _, e in spans if e <= end), *out[-1:]])
            if end - before >= MIN_MARK_PIECE:
                out.append(end)
        at += 1


@dataclass(frozen=True)
class Layout:
    """The boundaries of one prompt's fresh evaluation: multiples of ``align`` outside images,
    each image's start and end (``spans``, each evaluated whole) and turn ``marks``. A function
    of the prompt alone, built once per prompt (:meth:`of`); its methods are the split rules."""

    align: int = ALIGN
    spans: tuple[Span, ...] = ()
    marks: tuple[int, ...] = ()

    @classmethod
    def of(cls, prompt: Sequence[int], align: int = ALIGN, spans: Sequence[Span] = (),
           marker: Sequence[int] = ()) -> Layout:  # fmt: skip
        """``prompt``'s layout: its images ``spans`` and the :func:`turn_marks` of ``marker``."""
        spans = tuple(spans)
        return cls(align, spans, turn_marks(prompt, marker, spans, align))

    def outside_image(self, pos: int) -> int:
        """``pos``, or the start of the image it falls inside (an image is never cut)."""
        return next((s for s, e in self.spans if s < pos < e), pos)

    def span_at(self, pos: int) -> Span | None:
        """The image that starts at ``pos`` (None: ``pos`` is a token's)."""
        return next((s for s in self.spans if s[0] == pos), None)

    def floor_cut(self, pos: int) -> int:
        """The last boundary at or before ``pos``: a multiple of ``align`` that is not inside
        an image, an image's start or end, or a mark."""
        best = self.outside_image(pos - pos % self.align)
        for start, end in self.spans:
            for bound in (start, end):
                if best < bound <= pos:
                    best = bound
        for mark in self.marks:
            if best < mark <= pos:
                best = mark
        return best

    def next_cut(self, pos: int) -> int:
        """The first boundary after ``pos`` (itself a boundary): the end of the image starting
        there, else the next multiple of ``align``, image start or mark."""
        cut = (pos // self.align + 1) * self.align
        for start, end in self.spans:
            if start == pos:
                return end
            if pos < start < cut:
                cut = start
        return min([cut, *(m for m in self.marks if pos < m < cut)])

    def last_piece_start(self, n_prompt: int) -> int:
        """Start of the last piece of an ``n_prompt``-token prompt: ``C*floor((N-1)/C)``
        without images or marks."""
        return self.floor_cut(n_prompt - 1) if n_prompt > 0 else 0

    def pieces(self, start: int, end: int, reproducible: bool, n_batch: int) -> list[Piece]:
        """Decode calls that evaluate positions ``[start, end)``; each image is one piece of
        its own.

        Reproducible: cut at every boundary (:meth:`next_cut`). Fast: ``n_batch`` tokens at a
        time from ``start`` (what ``Llama.eval`` does), cut at images.
        """
        out: list[Piece] = []
        pos = start
        while pos < end:
            if reproducible:
                stop = self.next_cut(pos)
            elif (span := self.span_at(pos)) is not None:
                stop = span[1]
            else:
                stop = min([pos + n_batch, *(s for s, _ in self.spans if s > pos)])
            stop = min(stop, end)
            out.append((pos, stop))
            pos = stop
        return out

    def stable_after(self, stable: int, piece: Piece) -> int:
        """The stable prefix after evaluating ``piece`` on a KV state whose stable prefix was
        ``stable`` and which held exactly ``piece[0]`` tokens: it grows only by a whole piece of
        a fresh evaluation (a full aligned one, an image, or the text up to a boundary)
        evaluated right after the stable prefix."""
        start, end = piece
        stable = min(stable, start)
        if start == stable and end == self.next_cut(start):
            return end
        return stable

    def logits_stable(self, stable_before: int, piece: Piece, n_prompt: int) -> bool:
        """Whether the logits after evaluating the prompt's final ``piece`` equal a fresh
        aligned evaluation's: it must be exactly the last piece of one, on a stable prefix."""
        start, end = piece
        return (end == n_prompt and start == self.last_piece_start(n_prompt)
                and stable_before >= start)


def usable(cached: Cached, prompt: Sequence[int], reproducible: bool, layout: Layout) -> int:
    """Tokens of ``cached`` a request may keep (before evaluating the rest of ``prompt``, laid
    out as ``layout``).

    Fast: the common prefix, leaving at least one token to evaluate (fresh logits), never part
    of an image. Reproducible: also capped by the stable prefix and the last piece's start,
    rounded down to a boundary. Either way nothing when the state would have to be cut below
    its ``cut_min`` (the cut would start over).
    """
    n = len(prompt)
    shared = common_prefix(cached.tokens, prompt)
    if not reproducible:
        keep = layout.outside_image(min(shared, n - 1))
    else:
        keep = layout.floor_cut(min(shared, cached.stable, layout.last_piece_start(n)))
    return keep if keep >= min(cached.cut_min, len(cached.tokens)) else 0


def is_exact(cached: Cached, prompt: Sequence[int], reproducible: bool) -> bool:
    """Whether ``cached`` can answer ``prompt`` with no evaluation at all."""
    if not cached.has_logits or len(cached.tokens) != len(prompt):
        return False
    if reproducible and not cached.logits_stable:
        return False
    return common_prefix(cached.tokens, prompt) == len(prompt)


def checkpoint_keep(live: Cached, checkpoints: Sequence[int], prompt: Sequence[int],
                    reproducible: bool, layout: Layout) -> int:  # fmt: skip
    """The longest prefix a checkpoint of the live sequence gives ``prompt``: the largest
    checkpoint position the live cells could keep if their window were whole (``cut_min``
    ignored: the checkpoint brings the window's cells back). 0: none fits, or ``reproducible``:
    a restored window's cells land elsewhere than a fresh evaluation's, and gemma-3-270m's
    logits then differ (measured: up to 0.87 after a branch 1,000 tokens into 2,500), so a
    greedy request, whose reply must not depend on what ran before, does not use them."""
    if reproducible:
        return 0
    whole = Cached(live.tokens, live.stable, cut_min=0)
    limit = usable(whole, prompt, reproducible, layout)
    return max((n for n in checkpoints if 0 < n <= limit), default=0)


def plan(prompt: Sequence[int], live: Cached, snapshots: Sequence[Cached], reproducible: bool,
         layout: Layout, checkpoints: Sequence[int] = ()) -> ReusePlan:  # fmt: skip
    """Choose the state to start from: an exact snapshot, else whichever of the live KV, its
    ``checkpoints`` (positions of the live sequence whose window cells were saved) and the
    snapshots keeps the most tokens (the live KV on a tie, then a checkpoint: restoring a
    snapshot costs the largest copy). A live KV that cannot be cut where the prompt leaves it
    (``cut_min``) keeps nothing, so a checkpoint at or before that point, or a snapshot of
    the previous prompt, wins when the prompt branches back past a sliding window."""
    if not prompt:
        raise ValueError("an empty prompt has nothing to plan")
    for i, snap in enumerate(snapshots):
        if is_exact(snap, prompt, reproducible):
            return ReusePlan(source=i, keep=len(prompt), exact=True)
    best = ReusePlan(source=-1, keep=usable(live, prompt, reproducible, layout))
    if checkpoints:
        keep = checkpoint_keep(live, checkpoints, prompt, reproducible, layout)
        if keep > best.keep:
            best = ReusePlan(source=CHECKPOINT, keep=keep)
    for i, snap in enumerate(snapshots):
        keep = usable(snap, prompt, reproducible, layout)
        if keep > best.keep:
            best = ReusePlan(source=i, keep=keep)
    return best

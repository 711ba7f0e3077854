"""Prompt planning (pure): which cached state a request reuses, piece boundaries, stable length."""

from __future__ import annotations

import pytest

from modeld.runner import promptplan as pp
from modeld.runner.promptplan import Cached, ReusePlan

C = 4  # a small alignment keeps the sequences readable
L = pp.Layout(C)  # text only: pieces cut at multiples of C


def seq(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_common_prefix() -> None:
    assert pp.common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert pp.common_prefix([1, 2], [1, 2, 3]) == 2
    assert pp.common_prefix([], [1]) == 0


@pytest.mark.parametrize(
    ("n", "start"), [(1, 0), (4, 0), (5, 4), (8, 4), (9, 8), (12, 8), (13, 12)]
)
def test_last_piece_start_is_the_multiple_below_the_last_token(n: int, start: int) -> None:
    assert L.last_piece_start(n) == start


def test_reproducible_pieces_are_cut_at_absolute_multiples() -> None:
    assert L.pieces(0, 10, True, 512) == [(0, 4), (4, 8), (8, 10)]
    assert L.pieces(4, 9, True, 512) == [(4, 8), (8, 9)]
    assert L.pieces(6, 6, True, 512) == []


def test_fast_pieces_are_n_batch_from_the_start() -> None:
    assert L.pieces(3, 12, False, 4) == [(3, 7), (7, 11), (11, 12)]
    assert L.pieces(0, 3, False, 512) == [(0, 3)]


def test_stable_grows_only_by_whole_aligned_pieces_after_the_stable_prefix() -> None:
    assert L.stable_after(0, (0, 4)) == 4
    assert L.stable_after(4, (4, 8)) == 8
    assert L.stable_after(8, (8, 10)) == 8  # partial piece
    assert L.stable_after(8, (10, 11)) == 8  # a decoded token
    assert L.stable_after(0, (0, 8)) == 0  # an 8-token batch is not two aligned pieces
    assert L.stable_after(4, (2, 6)) == 2  # evaluated after a truncation to 2
    assert L.stable_after(2, (2, 6)) == 2  # not aligned
    assert L.stable_after(3, (4, 8)) == 3  # not contiguous with the stable prefix


def test_logits_are_stable_only_after_the_last_aligned_piece_on_a_stable_prefix() -> None:
    assert L.logits_stable(8, (8, 10), 10)
    assert L.logits_stable(0, (0, 3), 3)  # one short piece from scratch
    assert not L.logits_stable(4, (8, 10), 10)  # the prefix was not stable
    assert not L.logits_stable(8, (9, 10), 10)  # only the last token re-evaluated
    assert not L.logits_stable(0, (0, 10), 10)  # one big batch


def test_reproducible_reuse_is_capped_by_stable_and_the_last_piece() -> None:
    prompt = seq(10)
    # whole prompt stable in the cache: reuse stops at the last piece's start (8)
    assert pp.usable(Cached(seq(10), 8), prompt, True, L) == 8
    # stable only to 4
    assert pp.usable(Cached(seq(10), 4), prompt, True, L) == 4
    # shared prefix of 7 rounds down to 4
    assert pp.usable(Cached([*seq(7), 99], 8), prompt, True, L) == 4
    # the same prompt 9 long: last piece starts at 8
    assert pp.usable(Cached(seq(12), 12), seq(9), True, L) == 8
    assert pp.usable(Cached(seq(12), 12), seq(8), True, L) == 4


def test_fast_reuse_is_the_longest_prefix_leaving_one_token() -> None:
    prompt = seq(10)
    assert pp.usable(Cached([*seq(7), 99], 0), prompt, False, L) == 7
    assert pp.usable(Cached(seq(10), 0), prompt, False, L) == 9
    assert pp.usable(Cached(seq(20), 0), prompt, False, L) == 9


def test_exact_hits_need_logits_and_for_greedy_stable_logits() -> None:
    prompt = seq(6)
    plain = Cached(seq(6), 4, logits_stable=False, has_logits=True)
    stable = Cached(seq(6), 4, logits_stable=True, has_logits=True)
    live = Cached(seq(6), 4)
    assert pp.is_exact(plain, prompt, False) and not pp.is_exact(plain, prompt, True)
    assert pp.is_exact(stable, prompt, True)
    assert not pp.is_exact(live, prompt, False)  # the live KV's logits are not the prompt's
    assert not pp.is_exact(stable, seq(7), False)


def test_plan_prefers_an_exact_snapshot_then_the_longest_reuse() -> None:
    prompt = seq(10)
    live = Cached(seq(3), 0)
    short = Cached(seq(6), 4, True, True)
    long = Cached([*seq(9), 50], 8, True, True)
    exact = Cached(seq(10), 8, True, True)
    assert pp.plan(prompt, live, [short, long, exact], False, L) == ReusePlan(2, 10, exact=True)
    assert pp.plan(prompt, live, [short, long], False, L) == ReusePlan(1, 9)
    assert pp.plan(prompt, live, [short, long], True, L) == ReusePlan(1, 8)
    # a tie goes to the live KV (no restore needed)
    assert pp.plan(prompt, Cached(seq(9), 8), [long], True, L) == ReusePlan(-1, 8)
    assert pp.plan(prompt, live, [], True, L) == ReusePlan(-1, 0)
    with pytest.raises(ValueError):
        pp.plan([], live, [], True, L)


def test_plan_never_reuses_a_non_stable_snapshot_for_greedy() -> None:
    prompt = seq(10)
    unstable = Cached(seq(10), 0, logits_stable=False, has_logits=True)
    assert pp.plan(prompt, Cached([], 0), [unstable], True, L) == ReusePlan(-1, 0)
    assert pp.plan(prompt, Cached([], 0), [unstable], False, L) == ReusePlan(0, 10, exact=True)


# --------------------------------------------------------------------------- images (issue 38)
# An image is a span of positions evaluated whole in a piece of its own: the fresh layout cuts
# at multiples of C outside images and at every image's start and end.

IMG = -7  # a placeholder token (one id for every position of one image)


def with_image(n: int, span: tuple[int, int]) -> list[int]:
    s, e = span
    return [IMG if s <= i < e else i for i in range(n)]


def test_pieces_keep_an_image_whole_and_cut_at_its_bounds() -> None:
    img = pp.Layout(C, ((5, 10),))
    assert img.pieces(0, 14, True, 64) == [(0, 4), (4, 5), (5, 10), (10, 12), (12, 14)]
    assert img.pieces(0, 14, False, 6) == [(0, 5), (5, 10), (10, 14)]
    assert img.pieces(10, 14, True, 64) == [(10, 12), (12, 14)]


def test_boundaries_skip_multiples_inside_an_image() -> None:
    img = pp.Layout(C, ((5, 10),))
    assert [img.floor_cut(p) for p in range(14)] == \
        [0, 0, 0, 0, 4, 5, 5, 5, 5, 5, 10, 10, 12, 12]  # fmt: skip
    assert img.next_cut(4) == 5 and img.next_cut(5) == 10
    assert img.next_cut(10) == 12
    assert img.last_piece_start(14) == 12 and img.last_piece_start(10) == 5


def test_reuse_never_keeps_part_of_an_image() -> None:
    img = pp.Layout(C, ((5, 10),))
    prompt = with_image(14, (5, 10))
    cached = Cached([*prompt[:7], 99, 98], stable=4)  # shares 7 positions: 2 of the image
    assert pp.usable(cached, prompt, False, img) == 5  # fast: back to the image's start
    stable = Cached(prompt, stable=12)
    assert pp.usable(stable, prompt, True, img) == 12
    assert pp.usable(Cached(prompt, stable=10), prompt, True, img) == 10
    # another image at the same place shares only the text before it
    other = [IMG - 1 if 5 <= i < 10 else i for i in range(14)]
    assert pp.usable(Cached(other, stable=12), prompt, True, img) == 5


def test_a_fresh_evaluation_with_an_image_is_stable_piece_by_piece() -> None:
    img = pp.Layout(C, ((5, 10),))
    stable, before = 0, 0
    todo = img.pieces(0, 14, True, 64)
    for piece in todo:
        before, stable = stable, img.stable_after(stable, piece)
    assert stable == 12  # the last piece (12, 14) is partial: a longer prompt cuts at 16
    assert img.logits_stable(before, todo[-1], 14)
    # fast pieces that run across a boundary do not count
    assert img.stable_after(10, (10, 14)) == 10


def test_a_state_that_cannot_be_cut_there_keeps_nothing_and_a_snapshot_wins() -> None:
    # the live cells: the previous prompt (0..7) and a reply (100, 101) the next prompt does not
    # repeat; a sliding-window cache can cut them no shorter than 9
    live = Cached([*seq(8), 100, 101], stable=0, cut_min=9)
    prompt = [*seq(8), 50, 51, 52]
    assert pp.usable(live, prompt, False, L) == 0
    assert pp.plan(prompt, live, [], False, L) == ReusePlan(source=-1, keep=0)
    snap = Cached(seq(8), stable=0, has_logits=True, cut_min=7)  # the previous prompt
    assert pp.plan(prompt, live, [snap], False, L) == ReusePlan(source=0, keep=8)  # no cut needed
    # a cut at or past cut_min, or none at all, is fine
    assert pp.usable(Cached([*seq(8), 100, 101], stable=0, cut_min=8), prompt, False, L) == 8
    assert pp.usable(Cached(seq(8), stable=0, cut_min=99), prompt, False, L) == 8


# --- Turn marks: a chat's reply starts a piece --------------------------------------------

M = [90, 91]  # a reply's opening (ChatML's "<|im_end|>\n<|im_start|>assistant\n", say)


def test_turn_marks_are_the_positions_after_each_opening_outside_images(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(pp, "MIN_MARK_PIECE", 1)
    tokens = [1, 90, 91, 5, 90, 6, 90, 91, 7, 90, 91]
    assert pp.turn_marks(tokens, M, align=64) == (3, 8, 11)
    assert pp.turn_marks(tokens, M, spans=[(7, 9)], align=64) == (3, 11)  # 8: in an image
    assert pp.turn_marks(tokens, [], align=64) == ()
    assert pp.turn_marks([90], M, align=64) == ()
    # a prompt's layout: its images and the marks outside them
    assert pp.Layout.of(tokens, 64, [(7, 9)], M) == pp.Layout(64, ((7, 9),), (3, 11))
    assert pp.Layout.of(tokens, 64) == pp.Layout(64)  # no marker, no marks


def test_a_mark_just_past_a_boundary_is_not_one() -> None:
    n = pp.MIN_MARK_PIECE
    tokens = [7] * (2 * n) + M + [7] * (n - 3) + M + [7] * 10 + M  # at 2n+2, 3n+1, 3n+13
    # 3n+1 is n-1 after the mark before it; 3n+13 is more than n after the last one kept
    assert pp.turn_marks(tokens, M, align=1000) == (2 * n + 2, 3 * n + 13)
    # 2n+2 is 2 past a multiple of align, or 3 past an image's end; then 3n+1 is a mark
    assert pp.turn_marks(tokens, M, align=2 * n) == (3 * n + 1,)
    assert pp.turn_marks(tokens, M, spans=[(5, 2 * n - 1)], align=1000) == (3 * n + 1,)


def test_marks_are_boundaries_of_a_fresh_evaluation() -> None:
    marked = pp.Layout(C, marks=(6, 9))
    assert marked.pieces(0, 11, True, 64) == [(0, 4), (4, 6), (6, 8), (8, 9), (9, 11)]
    assert marked.floor_cut(7) == 6 and marked.floor_cut(8) == 8
    assert marked.next_cut(4) == 6 and marked.next_cut(9) == 12
    assert marked.last_piece_start(11) == 9
    assert marked.pieces(0, 11, False, 64) == [(0, 11)]  # sampled: unaffected


def test_the_next_turn_keeps_the_whole_previous_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Turn 1 ends with the opening at 7 (not a multiple of C): its last piece [4, 7) ends at
    a mark, so it is stable, and turn 2 (turn 1, its reply, a new question) keeps all 7."""
    monkeypatch.setattr(pp, "MIN_MARK_PIECE", 1)
    turn1 = [1, 2, 3, 4, 5, *M]
    one = pp.Layout.of(turn1, C, marker=M)
    assert one.marks == pp.turn_marks(turn1, M, align=C)
    stable = 0
    for piece in one.pieces(0, len(turn1), True, 64):
        stable = one.stable_after(stable, piece)
    assert stable == 7
    assert one.logits_stable(4, (4, 7), 7)
    turn2 = [*turn1, 40, 41, 6, 7, 8, *M]  # the reply's tokens were decoded one by one
    cached = Cached([*turn1, 40, 41], stable)
    two = pp.Layout.of(turn2, C, marker=M)
    assert pp.usable(cached, turn2, True, two) == 7
    assert pp.usable(cached, turn2, True, L) == 4  # without marks: back to the multiple of C
    # a prompt that shares the tokens before a mark has the same boundaries up to it
    assert [m for m in two.marks if m <= 7] == list(one.marks)


def test_a_branch_past_the_window_restores_the_nearest_checkpoint_before_it() -> None:
    # 40 tokens cached, the window's cells reach back to 30; the prompt branches at 22
    live = Cached(seq(40), stable=40, cut_min=30)
    prompt = [*seq(22), 90, 91, 92]
    marks = [8, 16, 20, 24, 40]
    assert pp.plan(prompt, live, [], False, L) == ReusePlan(source=-1, keep=0)  # not cuttable
    assert pp.plan(prompt, live, [], False, L, marks) == ReusePlan(source=pp.CHECKPOINT, keep=20)
    # a reproducible request restores none (a restored window is not bitwise a fresh one)
    assert pp.plan(prompt, live, [], True, L, marks) == ReusePlan(source=-1, keep=0)
    # the live cells still cut there, or a longer snapshot: no checkpoint needed
    near = [*seq(34), 90]
    assert pp.plan(near, live, [], False, L, marks) == ReusePlan(source=-1, keep=34)
    snap = Cached(seq(23), stable=0, has_logits=True)
    assert pp.plan(prompt, live, [snap], False, L, marks) == ReusePlan(source=0, keep=22)
    # at least one token is evaluated: a checkpoint at the prompt's end is not a hit
    assert pp.plan(seq(24), live, [], False, L, [24]) == ReusePlan(source=-1, keep=0)

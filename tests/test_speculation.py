"""Prompt-lookup speculative decoding (issue 46): drafts from the sequence's own tokens,
checked in one decode call, with the reply unchanged.

The pure drafter first (what it proposes, how it adapts and pauses), then a real runner on the
default model: every reply is compared with drafting off, text and log-probabilities (a
difference in the last bit of a logit shows), greedy and seeded sampling, with a grammar, a
stop string, sequences decoding beside each other, and a cancel.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modeld.runner import speculate
from modeld.runner.speculate import Drafter
from modeld.wire import options
from modeld.wire import runnerwire as rp
from test_runner import Harness

CODE = ("def area(width, height):\n    return width * height\n\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n\n\n"
        "def diagonal(width, height):\n    return (width ** 2 + height ** 2) ** 0.5\n\n\n"
        "# The same three functions again, unchanged:\n\ndef area(width, height):\n")
PROSE = "Write a short story about a lighthouse keeper who finds a message in a bottle. Story:"


# ------------------------------------------------------------------------------- the drafter


def test_the_drafter_proposes_what_followed_the_longest_suffix_seen_before() -> None:
    d = Drafter(k_max=4)
    tokens = [1, 2, 3, 4, 5, 6, 9, 3, 4, 5, 7, 8, 2, 3, 4, 5]
    # the suffix 2 3 4 5 occurred at the start (then 6 9 ...); 3 4 5 alone later (then 7 8)
    assert d.draft(tokens, limit=10) == [6, 9, 3, 4]
    assert d.draft(tokens, limit=2) == [6, 9]
    assert Drafter(k_max=4).draft([1, 2, 3, 4, 5], limit=10) == []  # nothing repeats
    assert Drafter(k_max=0).draft(tokens, limit=10) == []


def test_the_latest_occurrence_wins_and_new_tokens_are_indexed() -> None:
    d = Drafter(k_max=3)
    tokens = [7, 8, 1, 7, 8, 2, 7, 8]
    assert d.draft(tokens, limit=9) == [2, 7, 8]  # after the later "7 8", not the first
    tokens += [2, 5, 5, 7, 8]  # grows as the reply does
    assert d.draft(tokens, limit=9) == [2, 5, 5]


def test_a_long_history_is_indexed_back_a_bounded_part_per_step() -> None:
    head = [1000, 1001, 1002, 1003]
    filler = list(range(2000, 2000 + 3 * speculate.INDEX_STEP))
    tokens = [*head, 42, *filler, 1000, 1001, 1002, 1003]
    d = Drafter(k_max=2)
    steps = 0
    while not (got := d.draft(tokens, limit=5)):
        steps += 1
        assert steps < 10
    assert got == [42, 2000]
    assert steps >= 2  # the head was reached only after a few bounded steps


def test_the_length_adapts_and_drafting_pauses_while_nothing_is_taken() -> None:
    d = Drafter(k_max=4, k=2)
    d.record(2, 2)
    assert d.k == 3  # taken whole: one longer
    d.record(3, 1)
    assert d.k == 2  # mostly refused: one shorter
    tokens = [5, 6, 7, 5, 6]
    for _ in range(speculate.MISSES_BEFORE_PAUSE):
        d.record(2, 0)
    paused = [d.draft(tokens, limit=5) for _ in range(3)]
    assert paused == [[], [7], [7]]  # a pause of one step, then drafts again (k is 1 now)
    for _ in range(speculate.MISSES_BEFORE_PAUSE):
        d.record(2, 0)
    assert [d.draft(tokens, limit=5) for _ in range(3)][:2] == [[], []]  # twice as long
    d.record(2, 1)
    assert d.counts.as_dict() == {"draft_tokens": 2 + 3 + 4 * speculate.MISSES_BEFORE_PAUSE + 2,
                                  "draft_accepted": 2 + 1 + 1,
                                  "draft_steps": 3 + 2 * speculate.MISSES_BEFORE_PAUSE}


def test_the_option_is_declared_once_with_both_api_names() -> None:
    assert options.api_fields("ollama")["draft_max"] == "draft_max"
    openai = options.api_fields("openai")
    assert openai["speculative.n_max"] == openai["draft_max"] == "draft_max"
    with pytest.raises(ValueError, match="draft_max"):
        options.parse({"draft_max": options.MAX_DRAFT + 1}, ValueError)


# ---------------------------------------------------------------- a real runner, default model

Reply = tuple[str, list[Any], dict[str, Any]]


@pytest.fixture()
def runner(default_model: Path) -> Iterator[Harness]:
    h = Harness("spec")
    loaded = h.loaded(default_model, n_ctx=1024, parallel=4, n_threads=2, prompt_cache_mib=0)
    assert loaded["greedy_batch_invariant"] is True
    yield h
    h.close()


def _ask(h: Harness, rid: str, prompt: str, **kw: Any) -> None:
    kw.setdefault("temperature", 0.0)
    kw.setdefault("max_tokens", 48)
    h.send(rp.generate(rid, prompt=prompt, raw=True, logprobs=True, top_logprobs=2, **kw))


def _replies(h: Harness, rids: list[str]) -> dict[str, Reply]:
    texts: dict[str, list[str]] = {r: [] for r in rids}
    probs: dict[str, list[Any]] = {r: [] for r in rids}
    done: dict[str, dict[str, Any]] = {}
    while len(done) < len(rids):
        msg = h.recv()
        rid = msg["rid"]
        if msg["type"] == "chunk":
            texts[rid].append(msg["text"])
            probs[rid].extend(msg.get("logprobs", []))
        else:
            assert msg["type"] == "done", msg
            done[rid] = msg
    return {r: ("".join(texts[r]), probs[r], done[r]) for r in rids}


def _one(h: Harness, rid: str, prompt: str, **kw: Any) -> Reply:
    _ask(h, rid, prompt, **kw)
    return _replies(h, [rid])[rid]


def _same(a: Reply, b: Reply) -> None:
    assert a[0] == b[0]
    assert a[1] == b[1]  # each token's log-probability and the best alternatives, bit for bit
    assert a[2]["usage"]["completion_tokens"] == b[2]["usage"]["completion_tokens"]


@pytest.mark.slow
def test_greedy_and_sampled_replies_are_the_same_with_drafts(runner: Harness) -> None:
    plain = _one(runner, "off", CODE, draft_max=0)
    drafted = _one(runner, "on", CODE, draft_max=6)
    _same(plain, drafted)
    timings = drafted[2]["timings"]
    assert timings["draft_accepted"] > 10  # the functions are copied: most drafts are taken
    assert timings["draft_accepted"] <= timings["draft_tokens"]
    assert "draft_tokens" not in plain[2]["timings"]
    # seeded sampling below 512 cells (a lone row's attention is not split there): each row
    # sampled in order from bit-equal logits, so the same draws give the same tokens
    sampled = {"temperature": 0.7, "seed": 11}
    _same(_one(runner, "s-off", CODE, draft_max=0, **sampled),
          _one(runner, "s-on", CODE, draft_max=6, **sampled))
    # nothing to copy: the same text, and drafts that find nothing cost no draft rows
    _same(_one(runner, "p-off", PROSE, draft_max=0), _one(runner, "p-on", PROSE, draft_max=6))


@pytest.mark.slow
def test_grammar_and_stop_string_cut_a_draft_where_the_plain_reply_stops(
    runner: Harness,
) -> None:
    grammar = 'root ::= "    return " [a-z *+()0-9.]+ "\\n"'
    _same(_one(runner, "g-off", CODE, draft_max=0, grammar=grammar),
          _one(runner, "g-on", CODE, draft_max=6, grammar=grammar))
    stop = {"stop": ["diagonal"]}
    plain, drafted = (_one(runner, "x-off", CODE, draft_max=0, **stop),
                      _one(runner, "x-on", CODE, draft_max=6, **stop))  # fmt: skip
    _same(plain, drafted)
    assert drafted[2]["stop_sequence"] == "diagonal"
    # the cells of drafts past the stop were removed: the same prompt again is the same reply
    _same(drafted, _one(runner, "x-again", CODE, draft_max=6, **stop))


@pytest.mark.slow
def test_sequences_drafting_beside_others_keep_their_replies(runner: Harness) -> None:
    """A sequence drafts only while it decodes alone (verify.drafts): the code edit outlives
    the three short replies beside it and drafts once they are done."""
    prompts = {"a": CODE, "b": PROSE, "c": CODE.replace("width", "w"), "d": PROSE + " Once"}
    lengths = {"a": 48, "b": 12, "c": 8, "d": 4}
    solo = {rid: _one(runner, f"solo-{rid}", p, draft_max=0, max_tokens=lengths[rid])
            for rid, p in prompts.items()}  # fmt: skip
    for rid, p in prompts.items():
        _ask(runner, rid, p, draft_max=6, max_tokens=lengths[rid])
    together = _replies(runner, list(prompts))
    for rid in prompts:
        _same(solo[rid], together[rid])
    assert together["a"][2]["timings"]["batched_max"] >= 2
    assert together["a"][2]["timings"]["draft_accepted"] > 0


@pytest.mark.slow
def test_a_cancel_mid_draft_leaves_the_sequence_reusable(runner: Harness) -> None:
    _ask(runner, "gone", CODE, draft_max=6, max_tokens=400)  # fmt: skip
    while (msg := runner.recv())["type"] == "chunk" and not msg["text"].strip():
        pass
    runner.send(rp.cancel("gone"))
    while (msg := runner.recv()).get("type") == "chunk":
        pass
    assert msg["type"] == "error" and msg["code"] == "cancelled", msg
    _same(_one(runner, "after-off", CODE, draft_max=0), _one(runner, "after-on", CODE, draft_max=6))


# ------------------------------------------------------------------------------- the daemon


@pytest.mark.slow
def test_the_daemon_drafts_by_its_setting_unless_a_request_says_0(
    daemon_factory: Any, default_model: Path
) -> None:
    d = daemon_factory("--parallel", "2", "--draft-max", "4")
    with d.client() as c:
        on = c.generate(str(default_model), CODE, raw=True, max_tokens=40, temperature=0)
        text = on.text()
        assert on.done is not None
        assert on.done["timings"]["draft_accepted"] > 0
        off = c.generate(str(default_model), CODE, raw=True, max_tokens=40, temperature=0,
                         draft_max=0)  # fmt: skip
        assert off.text() == text
        assert off.done is not None and off.done["timings"]["draft_tokens"] == 0
        stats = c.stats()
        assert stats["draft_tokens"] == on.done["timings"]["draft_tokens"]
        assert stats["draft_accepted"] == on.done["timings"]["draft_accepted"]
        assert 0 < stats["draft_acceptance"] <= 1

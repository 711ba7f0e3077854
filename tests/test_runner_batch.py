"""Continuous batching in a real runner process: several sequences share each decode step.

The runner is loaded with ``parallel`` N and sent several ``generate`` messages at once, the way
the daemon dispatches them; replies are told apart by request id. Tiny generated models (F32:
no repacked weights), real llama-cpp-python, real ZeroMQ.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from modeld.wire import runnerwire as rp
from test_runner import Harness

pytestmark = pytest.mark.slow

PROMPTS = ["the quick brown fox", "once upon a time", "1 2 3 4", "hello world"]


@pytest.fixture()
def runner() -> Iterator[Harness]:
    h = Harness("b1")
    yield h
    h.close()


def _replies(h: Harness, rids: list[str]) -> dict[str, tuple[str, dict[str, Any], list[str]]]:
    """Every message of requests ``rids`` until each has its done/error: (text, final, order),
    where ``order`` lists the rid of each message received, to see who streamed when."""
    texts: dict[str, list[str]] = {rid: [] for rid in rids}
    finals: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    while len(finals) < len(rids):
        msg = h.recv()
        rid = msg.get("rid")
        assert rid in texts and rid not in finals, msg
        order.append(rid)
        if msg["type"] == "chunk":
            texts[rid].append(msg["text"])
        else:
            assert msg["type"] in ("done", "error"), msg
            finals[rid] = msg
    return {rid: ("".join(texts[rid]), finals[rid], order) for rid in rids}


def _opts(prompt: str, **kw: Any) -> dict[str, Any]:
    return dict(prompt=prompt, raw=True, temperature=0.0, **kw)


def test_load_reports_the_sequences_and_their_context(runner: Harness, tiny_model: Path) -> None:
    loaded = runner.loaded(tiny_model, n_ctx=256, parallel=4)
    assert loaded["parallel"] == 4
    assert loaded["n_ctx"] == 256  # per sequence
    assert loaded["greedy_batch_invariant"] is True  # fixed decode shapes (microbatch.py)
    one = runner.loaded(tiny_model, n_ctx=256)
    assert one["parallel"] == 1 and one["greedy_batch_invariant"] is True


def test_concurrent_sequences_each_equal_their_solo_reply(
    runner: Harness, tiny_model: Path
) -> None:
    runner.loaded(tiny_model, n_ctx=256, parallel=4)
    greedy = {p: runner.generate(f"ref{i}", **_opts(p, max_tokens=200))[0]
              for i, p in enumerate(PROMPTS)}
    sampled_opts = dict(temperature=1.0, top_k=0, top_p=1.0, seed=11, max_tokens=200)
    sampled = runner.generate("sref", prompt=PROMPTS[0], raw=True, **sampled_opts)[0]
    assert len(set(greedy.values())) == len(PROMPTS)  # a mix-up between sequences shows
    for round_ in range(2):
        rids = [f"r{round_}-{i}" for i in range(len(PROMPTS))]
        for rid, prompt in zip(rids, PROMPTS, strict=True):
            runner.send(rp.generate(rid, **_opts(prompt, max_tokens=200)))
        runner.send(rp.generate(f"s{round_}", prompt=PROMPTS[0], raw=True, **sampled_opts))
        got = _replies(runner, [*rids, f"s{round_}"])
        for rid, prompt in zip(rids, PROMPTS, strict=True):
            text, done, _ = got[rid]
            assert done["type"] == "done" and done["usage"]["completion_tokens"] == 200, done
            assert text == greedy[prompt], (rid, prompt)
            # decoded together: the runner reports the four in one decode step (200 steps
            # each, so a request sent a few milliseconds late still joins the others)
            assert done["timings"]["batched_max"] == 4, done
        text, done, order = got[f"s{round_}"]
        assert text == sampled and done["type"] == "done"
        # the fifth request waited for a free sequence: it ended last
        assert order[-1] == f"s{round_}"


def test_cancelling_one_sequence_leaves_the_others_running(
    runner: Harness, tiny_model: Path
) -> None:
    runner.loaded(tiny_model, n_ctx=512, parallel=3)
    ref = {p: runner.generate(f"ref{i}", **_opts(p, max_tokens=300))[0]
           for i, p in enumerate(PROMPTS[:3])}
    rids = ["c0", "c1", "c2"]
    for rid, prompt in zip(rids, PROMPTS, strict=False):
        runner.send(rp.generate(rid, **_opts(prompt, max_tokens=300)))
    started: set[str] = set()
    texts: dict[str, list[str]] = {rid: [] for rid in rids}
    while started != set(rids):  # all three streaming
        msg = runner.recv()
        assert msg["type"] == "chunk", msg
        started.add(msg["rid"])
        texts[msg["rid"]].append(msg["text"])
    runner.send(rp.cancel("c1"))
    finals: dict[str, dict[str, Any]] = {}
    after_cancel: dict[str, int] = {"c0": 0, "c2": 0}
    while len(finals) < 3:
        msg = runner.recv()
        rid = msg["rid"]
        if msg["type"] == "chunk":
            texts[rid].append(msg["text"])
            if "c1" in finals:
                after_cancel[rid] += 1
        else:
            finals[rid] = msg
    assert finals["c1"]["type"] == "error" and finals["c1"]["code"] == "cancelled"
    assert finals["c1"]["details"]["completion_tokens"] < 300
    for rid, prompt in (("c0", PROMPTS[0]), ("c2", PROMPTS[2])):
        assert finals[rid]["type"] == "done", finals[rid]
        assert finals[rid]["usage"]["completion_tokens"] == 300
        assert after_cancel[rid] > 0  # it went on streaming after the cancellation
        assert "".join(texts[rid]) == ref[prompt]


def test_a_sequence_at_its_context_end_stops_while_the_others_continue(
    runner: Harness, tiny_model: Path
) -> None:
    runner.loaded(tiny_model, n_ctx=256, parallel=2)
    long_prompt = " ".join(["word"] * 50)  # about 200 tokens of the tiny vocabulary
    ref = runner.generate("ref", **_opts(PROMPTS[1], max_tokens=200))[0]
    runner.send(rp.generate("full", **_opts(long_prompt, max_tokens=1000)))
    runner.send(rp.generate("short", **_opts(PROMPTS[1], max_tokens=200)))
    got = _replies(runner, ["full", "short"])
    _, full, order = got["full"]
    assert full["type"] == "done" and full["finish_reason"] == "length", full
    assert full["usage"]["prompt_tokens"] + full["usage"]["completion_tokens"] == 256
    text, short, _ = got["short"]
    assert short["type"] == "done" and short["usage"]["completion_tokens"] == 200
    assert text == ref
    # the short one was still streaming when the full one ended
    assert order.index("full") < len(order) - 1 and order[-1] == "short"


def test_a_prompt_snapshot_serves_another_sequence(runner: Harness, tiny_model: Path) -> None:
    runner.loaded(tiny_model, n_ctx=512, parallel=2, prompt_cache_mib=64)
    prompt = " ".join(["alpha beta"] * 30)
    ref, first = runner.generate("p1", **_opts(prompt, max_tokens=20))
    assert first["usage"]["prompt_tokens_reused"] == 0
    # a long stream on another prompt takes the sequence that holds the prompt ...
    runner.send(rp.generate("busy", **_opts(PROMPTS[0], max_tokens=400)))
    assert runner.recv()["rid"] == "busy"
    # ... so the prompt goes to the other sequence, from the snapshot store
    runner.send(rp.generate("p2", **_opts(prompt, max_tokens=20)))
    runner.send(rp.cancel("busy"))
    got = _replies(runner, ["busy", "p2"])
    text, again, _ = got["p2"]
    assert again["type"] == "done"
    assert again["usage"]["prompt_tokens_reused"] == again["usage"]["prompt_tokens"]
    assert text == ref


def test_parallel_one_and_four_give_the_same_greedy_replies(
    runner: Harness, model_factory: Any
) -> None:
    """llama.cpp#7052: the number of slots must not change a request's greedy reply."""
    model = model_factory("llama", **dict(ggufgen.TINY, context_length=2048))
    replies: dict[int, list[str]] = {}
    for n in (1, 4):
        runner.loaded(model, n_ctx=1024, parallel=n)
        replies[n] = [runner.generate(f"g{n}-{i}", **_opts(p * 20, max_tokens=60))[0]
                      for i, p in enumerate(PROMPTS)]
    assert replies[1] == replies[4]

"""Which thread tokenizes a prompt (runner/prepare.py): an ordinary prompt at the runner's
priority, so it joins the batch while other streams decode; a long one on the idle class. The
reply's grammar is parsed on the same lane, not in the batch loop (a real runner, gemma's
vocabulary, a 5,000-word enum beside a stream)."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from modeld.errors import ContextExceededError
from modeld.runner import prepare, specs
from modeld.runner.prompting import Media, PromptText
from modeld.runner.vision import Image
from modeld.schema import to_gbnf
from modeld.wire import runnerwire as rp
from modeld.wire.messages import ChatMessage, Tool
from modeld.wire.options import Sampling
from test_runner import Harness
from test_runner_batch import _replies


def _spec(rid: str, **fields: object) -> specs.GenerateSpec:
    return specs.parse_generate(rp.generate(rid, **fields))  # type: ignore[arg-type]


def test_prompt_chars_counts_text_thinking_calls_and_tools() -> None:
    assert prepare.prompt_chars(_spec("a", prompt="x" * 10)) == 10
    chat = _spec("b", messages=[ChatMessage("user", "hello"),
                                ChatMessage("assistant", "ok", thinking="hmm")],
                 tools=[Tool("f", "d" * 100)])  # fmt: skip
    assert 5 + 2 + 3 + 100 < prepare.prompt_chars(chat) < 5 + 2 + 3 + 100 + 80


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
def test_ordinary_prompts_are_tokenized_at_normal_priority_long_ones_on_idle() -> None:
    def policy(spec: specs.GenerateSpec) -> prepare.Prepared:
        return prepare.Prepared([os.sched_getscheduler(0)],
                                PromptText(spec.prompt or "", add_bos=True, stops=()))

    preparer = prepare.Preparer(policy)
    short = preparer.start(_spec("s", prompt="hello"))
    long = preparer.start(_spec("l", prompt="x" * prepare.QUICK_CHARS))
    assert short.result(timeout=10)[0] == [os.SCHED_OTHER]
    assert long.result(timeout=10)[0] == [os.SCHED_IDLE]


WORDS = [f"w{i:04d}x" for i in range(5_000)]
STREAM = Sampling(temperature=1.0, seed=7)


@pytest.fixture()
def runner(default_model: Path) -> Iterator[Harness]:
    h = Harness("lanes")
    h.loaded(default_model, n_ctx=512, parallel=2)
    yield h
    h.close()


def _parsed_on(h: Harness, rid: str) -> list[str]:
    """The threads the runner's log says parsed request ``rid``'s grammar."""
    text = h.log_path.read_text(errors="replace")
    return re.findall(rf"request {rid}: its grammar \(\d+ bytes\) parsed in [\d.]+ ms on (\S+)",
                      text)


@pytest.mark.slow
def test_a_big_grammar_is_parsed_on_a_lane_and_joins_the_batch_ready(runner: Harness) -> None:
    """A 5,000-word enum's grammar (~50 KB) for a request joining a running stream: parsed on
    the ordinary lane's thread (its prompt is short), never on the batch loop's main thread;
    the reply is one of the words and the stream beside it ends normally."""
    gbnf = to_gbnf({"enum": WORDS}, "format", 1 << 21).gbnf
    assert len(gbnf) > 40_000
    runner.send(rp.generate("n", prompt="Write a long story about a lighthouse keeper.",
                            raw=True, sampling=replace(STREAM, max_tokens=48)))
    first = runner.recv()
    assert first["rid"] == "n" and first["type"] == "chunk", first
    runner.send(rp.generate("g", prompt="Pick a word.", raw=True, grammar=gbnf,
                            sampling=replace(STREAM, max_tokens=12, seed=2)))
    got = _replies(runner, ["n", "g"])
    assert got["n"][1]["type"] == "done", got["n"][1]
    assert got["g"][1]["type"] == "done", got["g"][1]
    if got["g"][1]["finish_reason"] == "stop":
        assert json.loads(got["g"][0]) in WORDS
    else:  # cut at 12 tokens: still a prefix of a word's JSON
        assert any(json.dumps(w).startswith(got["g"][0]) for w in WORDS), got["g"][0]
    assert _parsed_on(runner, "g") == ["modeld-tokenize"], runner.log_tail()


@pytest.mark.slow
def test_a_grammar_llama_cpp_rejects_is_that_requests_error_only(runner: Harness) -> None:
    """A grammar the parser rejects (the daemon checks first; here it reaches the runner) is
    the same clear invalid_request as before, answered by the loop from the lane's error;
    the stream beside it and the next constrained request are served."""
    runner.send(rp.generate("n", prompt="Once upon a time", raw=True,
                            sampling=replace(STREAM, max_tokens=24)))
    runner.send(rp.generate("bad", prompt="x", raw=True, grammar='root ::= ("a" ',
                            sampling=replace(STREAM, max_tokens=4)))
    got = _replies(runner, ["n", "bad"])
    err = got["bad"][1]
    assert err["type"] == "error" and err["code"] == "invalid_request", err
    assert "llama.cpp rejected the reply's grammar" in err["message"], err
    assert err.get("hint"), err
    assert got["n"][1]["type"] == "done", got["n"][1]
    text, done = runner.generate("ok", prompt="Yes or no?", raw=True,
                                 grammar='root ::= "yes" | "no"',
                                 sampling=replace(STREAM, max_tokens=4))
    assert done["type"] == "done" and text in ("yes", "no"), (text, done)


@pytest.mark.slow
def test_a_request_cancelled_while_its_long_prompt_is_prepared_frees_its_grammar(
    runner: Harness,
) -> None:
    """Cancelled while its long prompt (the idle lane) is still being tokenized: the cancel
    is answered at once, its grammar (parsed once the lane gets to it) is freed there, and
    the runner goes on serving constrained requests."""
    gbnf = to_gbnf({"enum": WORDS}, "format", 1 << 21).gbnf
    runner.send(rp.generate("long", prompt="lighthouse keeper " * 20_000, raw=True,
                            grammar=gbnf, sampling=replace(STREAM, max_tokens=4)))
    runner.send(rp.cancel("long"))
    _, final = runner.collect("long")
    assert final["type"] == "error" and final["code"] == "cancelled", final
    text, done = runner.generate("after", prompt="Pick a word.", raw=True, grammar=gbnf,
                                 sampling=replace(STREAM, max_tokens=12, seed=3))
    assert done["type"] == "done", done
    assert any(json.dumps(w).startswith(text) for w in WORDS), text
    assert _parsed_on(runner, "after") == ["modeld-tokenize"], runner.log_tail()


class _CountedImage(Image):
    """An image whose frees are counted (a chunk is freed once: Image.free is idempotent)."""

    freed = 0

    def free(self) -> None:  # the chunks are stand-ins: nothing for mtmd to free
        if self.chunk is not None:
            type(self).freed += 1
            self.chunk = None


def test_the_images_of_a_prompt_that_will_not_run_are_freed() -> None:
    """Each image chunk holds a preprocessed image (megabytes for a large projector): a prompt
    refused for its length, or only counted (count_only: Prepared.discard), frees them."""
    images = (_CountedImage("a", 4, chunk=object()), _CountedImage("b", 4, chunk=object()))
    text = PromptText("x", add_bos=True, stops=(), media=Media(((0, 4), (4, 8)), images))

    def tokens_of(spec: specs.GenerateSpec) -> tuple[list[int], PromptText]:
        return list(range(12)), text

    prepare_one = prepare.preparing(tokens_of, None, n_ctx_seq=10)  # type: ignore[arg-type]
    _CountedImage.freed = 0
    with pytest.raises(ContextExceededError):
        prepare_one(_spec("long", prompt="x"))
    assert _CountedImage.freed == 2 and all(i.chunk is None for i in images)
    images = (_CountedImage("c", 4, chunk=object()),)
    counted = prepare.Prepared([1], replace(text, media=Media(((0, 4),), images)))
    _CountedImage.freed = 0
    counted.discard()
    counted.discard()  # twice: still one free each
    assert _CountedImage.freed == 1 and images[0].chunk is None

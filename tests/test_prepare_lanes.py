"""Which thread tokenizes a prompt (runner/prepare.py): an ordinary prompt at the runner's
priority, so it joins the batch while other streams decode; a long one on the idle class."""

from __future__ import annotations

import os
import sys

import pytest

from modeld import runnerwire as rp
from modeld.messages import ChatMessage, Tool
from modeld.runner import prepare, specs
from modeld.runner.prompting import PromptText


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
        return [os.sched_getscheduler(0)], PromptText(spec.prompt or "", add_bos=True, stops=())

    preparer = prepare.Preparer(policy)
    short = preparer.start(_spec("s", prompt="hello"))
    long = preparer.start(_spec("l", prompt="x" * prepare.QUICK_CHARS))
    assert short.result(timeout=10)[0] == [os.SCHED_OTHER]
    assert long.result(timeout=10)[0] == [os.SCHED_IDLE]

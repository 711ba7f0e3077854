"""An agent's second turn evaluates only its new tokens: a Claude-Code-shaped conversation
(a ~8k-token system prompt with tools, its billing line changing every request) streamed with
the official ``anthropic`` client against a real daemon on the default model. Timing is
bench/b_agent.py's job; this checks the token counts the reply reports."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentutil import start

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import b_agent

Factory = Callable[..., Any]


def _streamed(client: Any, body: dict[str, Any]) -> Any:
    args = {k: v for k, v in body.items() if k not in ("stream", "metadata")}
    with client.messages.stream(**args, metadata=body["metadata"],
                                extra_query={"beta": "true"}) as s:
        for _ in s:
            pass
        return s.get_final_message()


@pytest.mark.slow
def test_second_turn_evaluates_only_the_new_tokens(daemon_factory: Factory,
                                                   default_model: Path) -> None:
    agent = start(daemon_factory)
    c = agent.anthropic
    first = b_agent.conversation(seed=7, words=6500)
    counted = c.messages.count_tokens(model="default", system=first["system"],
                                      tools=first["tools"], messages=first["messages"])
    assert 7500 < counted.input_tokens < 9500  # the ~8k-token system prompt and tools
    one = _streamed(c, first)
    assert (one.usage.cache_read_input_tokens or 0) == 0  # a fresh daemon: all evaluated
    assert one.usage.input_tokens == counted.input_tokens
    reply = "".join(b.text for b in one.content if b.type == "text")
    second = b_agent.follow_up(first, reply, seed=7)
    stamp_1, stamp_2 = first["system"][0]["text"], second["system"][0]["text"]
    assert stamp_1 != stamp_2 and "cch=" in stamp_2  # the billing line changed
    counted_2 = c.messages.count_tokens(model="default", system=second["system"],
                                        tools=second["tools"], messages=second["messages"])
    two = _streamed(c, second)
    evaluated, cached = two.usage.input_tokens, two.usage.cache_read_input_tokens or 0
    assert evaluated + cached == counted_2.input_tokens
    new = counted_2.input_tokens - counted.input_tokens
    assert cached >= counted.input_tokens - 4  # the whole first prompt came from the cache
    assert 0 < evaluated <= new + 4, (evaluated, new)  # only the new turn was evaluated

"""Honest stops and early bytes on the agent APIs (issue 36), against a real daemon.

A reply that runs into the end of the context it can have (here its model's training context:
one that can grow goes on, tests/test_grow_reply.py) says so (Anthropic's
``model_context_window_exceeded``, OpenAI's ``length`` with ``length_reason``, Responses'
``incomplete`` in the response and its last item alike); one cut by its own limit still says
``max_tokens``. A stream whose first token is long in coming sends its headers, its opening
event and keep-alives first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import ggufgen
from agentutil import GREEDY, Agent, start
from modeld.http import ticks

Factory = Callable[..., Any]
LONG = dict(ggufgen.TINY_CHAT, context_length=65536)
SHORT = dict(ggufgen.TINY_CHAT, context_length=256)  # a reply cannot grow past it
ASK = [{"role": "user", "content": "Count on and on."}]


@pytest.fixture()
def agent(daemon_factory: Factory, model_factory: Factory) -> Iterator[Agent]:
    a = start(daemon_factory)
    (a.d.root / "models").mkdir(exist_ok=True)
    for name, shape in (("tiny", LONG), ("short", SHORT)):
        (a.d.root / "models" / f"{name}.gguf").write_bytes(Path(model_factory(
            "llama", **shape)).read_bytes())
    yield a


def test_a_full_context_is_not_called_max_tokens(agent: Agent) -> None:
    agent.d.client().load("short", n_ctx=256, parallel=1)
    full = agent.anthropic.messages.create(model="short", max_tokens=32000, messages=ASK,
                                           extra_body=GREEDY)  # type: ignore[arg-type]
    assert full.stop_reason == "model_context_window_exceeded"
    used = full.usage.input_tokens + (full.usage.cache_read_input_tokens or 0)
    assert used + full.usage.output_tokens >= 254  # it did run to the end of the 256 cells
    short = agent.anthropic.messages.create(model="short", max_tokens=5, messages=ASK,
                                            extra_body=GREEDY)  # type: ignore[arg-type]
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 5

    chat = httpx.post(f"{agent.base}/v1/chat/completions", timeout=120, json={
        "model": "short", "messages": ASK, **GREEDY}).json()["choices"][0]
    assert chat["finish_reason"] == "length" and chat["length_reason"] == "context_window"
    limited = httpx.post(f"{agent.base}/v1/chat/completions", timeout=120, json={
        "model": "short", "messages": ASK, "max_tokens": 4, **GREEDY}).json()["choices"][0]
    assert limited["finish_reason"] == "length" and limited["length_reason"] == "max_tokens"
    with agent.openai.chat.completions.create(model="short", messages=ASK, stream=True,
                                              temperature=0) as s:  # type: ignore[arg-type]
        last = [c for c in s][-1].choices[0]
    assert last.finish_reason == "length" and last.model_extra == {
        "length_reason": "context_window"}


def test_responses_incomplete_agrees_with_its_message(agent: Agent) -> None:
    agent.d.client().load("short", n_ctx=256, parallel=1)
    whole = agent.openai.responses.create(model="short", input="Count on and on.",
                                          temperature=0)
    assert whole.status == "incomplete" and whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "context_window"  # type: ignore[comparison-overlap]
    assert [i.status for i in whole.output if i.type == "message"] == ["incomplete"]
    cut = agent.openai.responses.create(model="short", input="Count on and on.",
                                        temperature=0, max_output_tokens=16)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert [i.status for i in cut.output if i.type == "message"] == ["incomplete"]
    done = []
    with agent.openai.responses.stream(model="short", input="Count on and on.",
                                       temperature=0) as s:
        for ev in s:
            if ev.type == "response.output_item.done":
                done.append(ev.item.status)  # type: ignore[union-attr]
        final = s.get_final_response()
    assert final.status == "incomplete" and done == ["incomplete"]


def _hold(agent: Agent, release: threading.Event, started: threading.Event) -> None:
    """Keep the model's one sequence busy (a reply that would run for 60k tokens) until
    ``release``; then leave (the daemon cancels it)."""
    with httpx.stream("POST", f"{agent.base}/v1/chat/completions", timeout=120, json={
            "model": "tiny", "messages": ASK, "stream": True, **GREEDY}) as r:
        for _ in r.iter_lines():
            started.set()
            if release.is_set():
                return


def _watch(agent: Agent, path: str, body: dict[str, Any], release: threading.Event
           ) -> list[tuple[float, str]]:
    """The stream's lines as (seconds since the request, what): ``event: X`` names, SSE
    comments as ``:``, ``data`` as ``data``; the holder is released after two keep-alives."""
    seen: list[tuple[float, str]] = []
    t0 = time.monotonic()
    with httpx.stream("POST", f"{agent.base}{path}", timeout=120, json=body) as r:
        assert r.status_code == 200  # the headers came while the model was busy
        for line in r.iter_lines():
            if line.startswith("event: "):
                seen.append((time.monotonic() - t0, line[7:]))
            elif line.startswith(":"):
                seen.append((time.monotonic() - t0, ":"))
            elif line.startswith("data: ") and path.endswith("/completions"):
                seen.append((time.monotonic() - t0, "data"))
            kept = [n for _, n in seen if n in ("ping", ":")]
            if len(kept) >= 2 and not release.is_set():
                release.set()  # the holder leaves: this request gets the model
    return seen


@pytest.mark.parametrize("api", ["anthropic", "responses", "chat"])
def test_a_waiting_stream_starts_and_pings_before_its_first_token(agent: Agent,
                                                                 api: str) -> None:
    agent.d.client().load("tiny", n_ctx=61440, parallel=1)
    release, started = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold, args=(agent, release, started))
    holder.start()
    try:
        assert started.wait(60)
        if api == "anthropic":
            seen = _watch(agent, "/v1/messages", {"model": "tiny", "max_tokens": 4,
                                                  "stream": True, "messages": ASK, **GREEDY},
                          release)
            opening, keepalive, last = ["message_start"], "ping", "message_stop"
        elif api == "responses":
            seen = _watch(agent, "/v1/responses", {"model": "tiny", "max_output_tokens": 4,
                                                   "stream": True, "input": "Count on.",
                                                   **GREEDY}, release)
            opening, keepalive, last = ["response.created", "response.in_progress"], ":", \
                "response.completed"
        else:
            seen = _watch(agent, "/v1/chat/completions", {"model": "tiny", "max_tokens": 4,
                                                          "stream": True, "messages": ASK,
                                                          **GREEDY}, release)
            opening, keepalive, last = [], ":", "data"
        names = [n for _, n in seen]
        # the opening events and keep-alives first, while another reply held the model
        assert names[:len(opening) + 2] == [*opening, keepalive, keepalive]
        assert names[-1] == last
        first, second = (t for t, n in seen if n == keepalive)
        assert second - first >= ticks.PING_S * 0.9  # then one each PING_S of silence
        assert len([n for n in names if n not in (keepalive, *opening)]) > 1  # the reply
    finally:
        release.set()
        holder.join(60)

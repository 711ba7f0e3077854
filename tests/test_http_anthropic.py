"""Anthropic's Messages API (what Claude Code speaks) driven by the official ``anthropic``
client against a real daemon on the default model (gemma-3-270m, a base model: forced tool
calls are grammar-constrained, so they work on it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from agentutil import GREEDY, WEATHER, Agent, add_thinker, free_port, satisfies, start
from daemonutil import until
from modeld.http.anthropicreq import drop_volatile_lines, messages_generate

Factory = Callable[..., Any]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture()
def agent(daemon_factory: Factory, default_model: Path) -> Iterator[Agent]:
    yield start(daemon_factory)


def test_create_and_stream_with_events_in_order(agent: Agent) -> None:
    c = agent.anthropic
    whole = c.messages.create(model="default", max_tokens=12, messages=QUESTION,
                              extra_body=GREEDY, extra_query={"beta": "true"},
                              extra_headers={"anthropic-beta": "claude-code-20250219"})
    assert whole.type == "message" and whole.role == "assistant" and whole.model == "default"
    assert whole.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in whole.content] == ["text"]
    assert whole.usage.input_tokens > 0 and 0 < whole.usage.output_tokens <= 12
    events = []
    with c.messages.stream(model="default", max_tokens=12, messages=QUESTION,
                           extra_body=GREEDY) as s:
        for ev in s:
            events.append(ev)
        final = s.get_final_message()
    kinds = [e.type for e in events if e.type in (
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop")]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert all(d.type == "text_delta" for d in deltas)
    assert "".join(d.text for d in deltas) == whole.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == whole.stop_reason
    # The prompt is the same: its tokens now come from the runner's prompt cache.
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert (final.usage.cache_read_input_tokens or 0) + final.usage.input_tokens == (
        whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0))
    # The raw stream carries a ping after message_start, as Anthropic's does.
    raw = httpx.post(f"{agent.base}/v1/messages?beta=true", timeout=120, json={
        "model": "default", "max_tokens": 3, "stream": True, "messages": QUESTION, **GREEDY})
    names = [line[7:] for line in raw.text.splitlines() if line.startswith("event: ")]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"


def test_count_tokens_matches_the_prompt_a_reply_evaluates(agent: Agent) -> None:
    c = agent.anthropic
    system = "You are terse."
    counted = c.messages.count_tokens(model="default", system=system, messages=QUESTION)
    reply = c.messages.create(model="default", max_tokens=1, system=system, messages=QUESTION,
                              extra_body=GREEDY)
    assert counted.input_tokens == reply.usage.input_tokens
    assert not reply.usage.cache_read_input_tokens  # counting evaluated (and cached) nothing
    with_tools = c.messages.count_tokens(model="default", system=system, messages=QUESTION,
                                         tools=[WEATHER])  # type: ignore[list-item]
    assert with_tools.input_tokens > counted.input_tokens + 20  # the tools' text is shown
    hidden = c.messages.count_tokens(model="default", system=system, messages=QUESTION,
                                     tools=[WEATHER],  # type: ignore[list-item]
                                     tool_choice={"type": "none"})
    assert hidden.input_tokens == counted.input_tokens
    # A system message inside messages (Claude Code >= 2.1.154) is the system prompt.
    inside = c.messages.count_tokens(model="default", messages=[
        {"role": "system", "content": system}, *QUESTION])  # type: ignore[list-item]
    assert inside.input_tokens == counted.input_tokens
    # Claude Code's per-request billing line is dropped: it never reaches the prompt.
    stamped = c.messages.count_tokens(model="default", messages=QUESTION, system=[
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.37; cch=5a1e3;"},
        {"type": "text", "text": system}])
    assert stamped.input_tokens == counted.input_tokens
    # count_tokens evaluates nothing: the runner's counters did not move.
    before = agent.d.client().stats()["tokens_generated"]
    c.messages.count_tokens(model="default", messages=QUESTION)
    assert agent.d.client().stats()["tokens_generated"] == before


def test_forced_tool_call_then_a_tool_result_turn(agent: Agent) -> None:
    c = agent.anthropic
    ask = [{"role": "user", "content": "What will the weather be in Paris for 3 days?"}]
    r = c.messages.create(model="default", max_tokens=60, messages=ask,  # type: ignore[arg-type]
                          tools=[WEATHER],  # type: ignore[list-item]
                          tool_choice={"type": "tool", "name": "get_weather"},
                          extra_body=GREEDY)
    assert r.stop_reason == "tool_use"
    (call,) = [b for b in r.content if b.type == "tool_use"]
    assert call.name == "get_weather" and satisfies(call.input, WEATHER["input_schema"])
    streamed = []
    with c.messages.stream(model="default", max_tokens=60, messages=ask,  # type: ignore[arg-type]
                           tools=[WEATHER],  # type: ignore[list-item]
                           tool_choice={"type": "tool", "name": "get_weather"},
                           extra_body=GREEDY) as s:
        streamed = [e for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert streamed and all(e.delta.type == "input_json_delta" for e in streamed)
    (scall,) = [b for b in final.content if b.type == "tool_use"]
    assert scall.input == call.input and final.stop_reason == "tool_use"
    history: list[Any] = [*ask, {"role": "assistant", "content": [
        {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}]}]
    result = "Sunny, 24 degrees, all three days."
    turn = [*history, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": result}]}]
    after = c.messages.create(model="default", max_tokens=20, messages=turn,
                              tools=[WEATHER],  # type: ignore[list-item]
                              extra_body=GREEDY)
    assert after.stop_reason in ("end_turn", "max_tokens", "tool_use") and after.content
    # The result's text is in the prompt (as blocks too, and is_error says it failed).
    base = c.messages.count_tokens(model="default", messages=turn)
    blocks = c.messages.count_tokens(model="default", messages=[*history, {
        "role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                     "content": [{"type": "text", "text": result}]}]}])
    failed = c.messages.count_tokens(model="default", messages=[*history, {
        "role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                     "content": result, "is_error": True}]}])
    assert blocks.input_tokens == base.input_tokens < failed.input_tokens
    longer = c.messages.count_tokens(model="default", messages=[*history, {
        "role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                     "content": result * 3}]}])
    assert longer.input_tokens > base.input_tokens + 10


def test_unknown_fields_metadata_and_stop_sequences(agent: Agent) -> None:
    c = agent.anthropic
    r = c.messages.create(
        model="default", max_tokens=12, messages=QUESTION, metadata={"user_id": "u1"},
        extra_body={**GREEDY, "context_management": {"edits": []}, "some_future_field": 1,
                    "output_config": {"effort": "low"}},
    )
    assert r.content and r.content[0].type == "text"
    first_word = r.content[0].text.split()[0]  # type: ignore[union-attr]
    stopped = c.messages.create(model="default", max_tokens=12, messages=QUESTION,
                                stop_sequences=[first_word], extra_body=GREEDY)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == first_word


def test_errors_have_anthropics_shape(agent: Agent) -> None:
    c = agent.anthropic
    with pytest.raises(anthropic.NotFoundError) as nf:
        c.messages.create(model="no-such-model", max_tokens=5, messages=QUESTION)
    body: Any = nf.value.body
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as image:
        c.messages.create(model="default", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}}]}])
    body = image.value.body
    assert body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0]" in body["error"]["message"]
    prefill = httpx.post(f"{agent.base}/v1/messages", json={
        "model": "default", "max_tokens": 5,
        "messages": [*QUESTION, {"role": "assistant", "content": "The capital is"}]})
    assert prefill.status_code == 400 and "prefill" in prefill.json()["error"]["message"]
    missing = httpx.post(f"{agent.base}/v1/messages", json={"model": "default",
                                                            "messages": QUESTION})
    assert missing.status_code == 400 and "max_tokens" in missing.json()["error"]["message"]
    streamed = httpx.post(f"{agent.base}/v1/messages", json={
        "model": "no-such-model", "max_tokens": 5, "stream": True, "messages": QUESTION})
    assert streamed.status_code == 404 and streamed.json()["type"] == "error"


def test_x_api_key_is_accepted_as_the_key(daemon_factory: Factory) -> None:
    port = free_port()
    daemon_factory("--http", f"0.0.0.0:{port}", env={"MODELD_API_KEY": "s3cret"})
    url = f"http://127.0.0.1:{port}/api/version"
    until(lambda: httpx.get(url).status_code == 401, timeout=30, what="the front door")
    assert httpx.get(url, headers={"x-api-key": "s3cret"}).status_code == 200
    assert httpx.get(url, headers={"x-api-key": "wrong"}).status_code == 401


# --------------------------------------------------------------------------- pure translation


def test_translation_maps_every_block_kind() -> None:
    body = messages_generate({
        "model": "m", "max_tokens": 9, "stop_sequences": ["END"], "top_k": 5,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=1;\nBe brief."}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "system", "content": "Later rule."},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "boom",
                 "is_error": True},
                {"type": "text", "text": "and now?"}]},
        ],
        "tools": [{"name": "f", "input_schema": {"type": "object"}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "any"}, "thinking": {"type": "disabled"},
    })
    assert body["messages"] == [
        {"role": "system", "content": "Be brief.\n\nLater rule."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "calling", "thinking": "hmm",
         "tool_calls": [{"name": "f", "arguments": {"a": 1}, "id": "t1"}]},
        {"role": "tool", "content": "Error: boom", "tool_call_id": "t1", "tool_name": "f"},
        {"role": "user", "content": "and now?"},
    ]
    assert body["options"] == {"max_tokens": 9, "stop": ["END"], "top_k": 5}
    assert body["tools"] == [{"name": "f", "parameters": {"type": "object"}}]
    assert body["tool_choice"] == "required" and body["think"] is False


def test_volatile_lines_are_dropped_and_nothing_else() -> None:
    text = "x-anthropic-billing-header: cc_version=2.1.37.3a1; cch=00f1e;\nYou are Claude Code."
    assert drop_volatile_lines(text) == "You are Claude Code."
    kept = "Mention x-anthropic-billing-header: in docs.\nok"
    assert drop_volatile_lines(kept) == kept


def test_thinking_blocks_streamed_and_refused_where_the_model_does_not_think(
        agent: Agent, model_factory: Factory) -> None:
    """A model whose prompt opens ``<think>`` (agentutil.add_thinker): its reply is all
    thinking, so it comes back as a thinking block and thinking_delta events."""
    add_thinker(agent, model_factory)
    c = agent.anthropic
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    r = c.messages.create(model="thinker", max_tokens=6, messages=QUESTION, thinking=thinking,
                          extra_body=GREEDY)
    assert [b.type for b in r.content] == ["thinking"] and r.stop_reason == "max_tokens"
    with c.messages.stream(model="thinker", max_tokens=6, messages=QUESTION,
                           thinking=thinking, extra_body=GREEDY) as s:
        deltas = [e.delta for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert deltas and all(d.type == "thinking_delta" for d in deltas)
    assert final.content[0].thinking == r.content[0].thinking  # type: ignore[union-attr]
    # A thinking block in the history is the assistant turn's thinking (accepted, not text).
    again = c.messages.create(model="thinker", max_tokens=2, extra_body=GREEDY, messages=[
        *QUESTION, {"role": "assistant", "content": [  # type: ignore[list-item]
            {"type": "thinking", "thinking": "hmm", "signature": ""},
            {"type": "text", "text": "Paris."}]},
        {"role": "user", "content": "And Spain?"}])
    assert again.content
    with pytest.raises(anthropic.BadRequestError) as refused:  # the default model cannot think
        c.messages.create(model="default", max_tokens=2, messages=QUESTION, thinking=thinking)
    assert "does not think" in refused.value.body["error"]["message"]  # type: ignore[index]

"""OpenAI's Responses API (what Codex CLI speaks) driven by the official ``openai`` client
against a real daemon on the default model."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agentutil import WEATHER, Agent, add_thinker, satisfies, start
from modeld.http.responsesreq import ResponseStore, input_messages, responses_generate

Factory = Callable[..., Any]
FUNCTION: Any = {"type": "function", "name": WEATHER["name"],
                 "description": WEATHER["description"], "parameters": WEATHER["input_schema"]}
ASK = "What will the weather be in Paris for 3 days?"


@pytest.fixture()
def agent(daemon_factory: Factory, default_model: Path) -> Iterator[Agent]:
    yield start(daemon_factory)


def test_text_and_stream(agent: Agent) -> None:
    c = agent.openai
    r = c.responses.create(model="default", input="What is the capital of France?",
                           instructions="Answer in one word.", max_output_tokens=8,
                           temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output_text and [o.type for o in r.output] == ["message"]
    assert r.usage is not None and 0 < r.usage.output_tokens <= 8 and r.usage.input_tokens > 0
    kinds = []
    with c.responses.stream(model="default", input="What is the capital of France?",
                            instructions="Answer in one word.", max_output_tokens=8,
                            temperature=0) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert kinds[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert final.output_text == r.output_text and final.status == r.status
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens > 0


def test_forced_function_call_and_its_output_continued(agent: Agent) -> None:
    c = agent.openai
    # A hosted tool Codex declares is skipped, not refused.
    r = c.responses.create(model="default", input=ASK, temperature=0,
                           tools=[FUNCTION, {"type": "web_search"}],
                           tool_choice={"type": "function", "name": "get_weather"})
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert satisfies(json.loads(call.arguments), WEATHER["input_schema"])
    with c.responses.stream(model="default", input=ASK, temperature=0, tools=[FUNCTION],
                            tool_choice={"type": "function", "name": "get_weather"}) as s:
        kinds = [e.type for e in s]
        streamed = s.get_final_response()
    assert kinds[:3] == ["response.created", "response.in_progress",
                         "response.output_item.added"]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-3:] == ["response.function_call_arguments.done",
                          "response.output_item.done", "response.completed"]
    assert streamed.output[0].arguments == call.arguments  # type: ignore[union-attr]
    output = {"type": "function_call_output", "call_id": call.call_id,
              "output": "Sunny, 24 degrees."}
    # Continued from the stored response: its conversation comes before the new items.
    after = c.responses.create(model="default", previous_response_id=r.id, input=[output],
                               tools=[FUNCTION], max_output_tokens=12, temperature=0)
    assert after.previous_response_id == r.id and after.output
    # The same turn sent whole (stateless, as Codex does) is the same prompt.
    whole = c.responses.create(model="default", tools=[FUNCTION], max_output_tokens=12,
                               temperature=0, store=False, input=[
                                   {"role": "user", "content": ASK},
                                   {"type": "function_call", "call_id": call.call_id,
                                    "name": call.name, "arguments": call.arguments},
                                   output])
    assert whole.usage is not None and after.usage is not None
    assert whole.usage.input_tokens == after.usage.input_tokens
    assert whole.output_text == after.output_text
    with pytest.raises(openai.BadRequestError) as unknown:
        c.responses.create(model="default", previous_response_id=whole.id, input="hi")
    assert "previous_response_id" in str(unknown.value)  # store: false kept nothing


def test_json_schema_output_and_refusals(agent: Agent) -> None:
    c = agent.openai
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    r = c.responses.create(model="default", input="Name a city in France as JSON.",
                           temperature=0, max_output_tokens=40,
                           text={"format": {"type": "json_schema", "name": "city",
                                            "schema": schema, "strict": True}})
    assert satisfies(json.loads(r.output_text), schema)
    probe = c.responses.create(model="default", input=[], max_output_tokens=1)  # Codex's probe
    assert probe.usage is not None and probe.usage.output_tokens == 1
    bad = httpx.post(f"{agent.base}/v1/responses", json={
        "model": "default", "input": "hi", "frobnicate": 1})
    assert bad.status_code == 400 and "frobnicate" in bad.json()["error"]["message"]
    image = httpx.post(f"{agent.base}/v1/responses", json={"model": "default", "input": [
        {"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]})
    assert image.status_code == 400 and "input[0].content[0]" in image.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="no-such-model", input="hi", stream=True)


def test_reasoning_items(agent: Agent, model_factory: Factory) -> None:
    model = add_thinker(agent, model_factory)
    c = agent.openai
    r = c.responses.create(model=model, input="hi", max_output_tokens=6, temperature=0,
                           reasoning={"effort": "high"})
    assert [o.type for o in r.output] == ["reasoning"] and r.status == "incomplete"
    with c.responses.stream(model=model, input="hi", max_output_tokens=6, temperature=0,
                            reasoning={"effort": "high"}) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.reasoning_text.delta" in kinds
    assert final.output[0].content == r.output[0].content  # type: ignore[union-attr]


# --------------------------------------------------------------------------- pure translation


def test_items_become_one_assistant_turn_and_tool_results() -> None:
    msgs = input_messages([
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": ""},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
    ], [])
    assert msgs == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "thinking": "think", "tool_calls": [
            {"id": "c1", "name": "f", "arguments": "{\"a\":1}"},
            {"id": "c2", "name": "g", "arguments": "{}"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one", "tool_name": "f"},
        {"role": "tool", "tool_call_id": "c2", "content": "two", "tool_name": "g"},
    ]
    body, conv = responses_generate({"input": "x", "instructions": "sys",
                                     "max_output_tokens": 5, "reasoning": {"effort": "none"},
                                     "tools": [FUNCTION, {"type": "local_shell"}]}, [])
    assert body["messages"][0] == {"role": "system", "content": "sys"}
    assert conv == [{"role": "user", "content": "x"}]  # instructions are not carried on
    assert body["options"]["max_tokens"] == 5 and body["think"] is False
    assert [t["name"] for t in body["tools"]] == ["get_weather"]


def test_the_store_is_bounded() -> None:
    store = ResponseStore(size=2)
    for i in range(3):
        store.put(f"r{i}", [{"role": "user", "content": str(i)}])
    assert store.get("r2") == [{"role": "user", "content": "2"}]
    with pytest.raises(Exception, match="not known"):
        store.get("r0")

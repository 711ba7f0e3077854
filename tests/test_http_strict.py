"""Strict where the real APIs are (issue 35, finding 11), on a real daemon through the official
``openai`` and ``anthropic`` clients: a tool result that answers no call is a 400 on OpenAI's
chat completions, Anthropic's Messages and the Responses API (both vendors refuse it), and an
Anthropic ``document`` with a text source is read as text (a PDF is refused for what it is,
not as a missing image projector)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from agentutil import GREEDY, Agent, start
from modeld.errors import InvalidRequestError
from modeld.http.anthropicreq import messages_generate
from modeld.http.chatreq import openai_messages
from modeld.http.responsesreq import input_messages

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}


@pytest.fixture()
def agent(daemon_factory: Callable[..., Any], default_model: Path) -> Iterator[Agent]:
    yield start(daemon_factory)


def test_openai_chat_refuses_a_tool_message_that_answers_no_call(agent: Agent) -> None:
    ask = {"role": "user", "content": "Weather in Paris?"}
    orphan = [ask, {"role": "tool", "tool_call_id": "call_nope", "content": "sunny"}]
    late = [ask, {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "user", "content": "and?"},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]  # fmt: skip
    wrong = [ask, {"role": "assistant", "content": None, "tool_calls": [CALL]},
             {"role": "tool", "tool_call_id": "call_2", "content": "sunny"}]  # fmt: skip
    for msgs in (orphan, late, wrong):
        with pytest.raises(openai.BadRequestError) as err:
            agent.openai.chat.completions.create(model="default", messages=msgs,  # type: ignore[arg-type]
                                                 max_tokens=3)
        assert err.value.status_code == 400 and "answers no tool call" in str(err.value)
        assert "tool_call_id" in str(err.value)
    good = [ask, {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]  # fmt: skip
    r = agent.openai.chat.completions.create(model="default", messages=good,  # type: ignore[arg-type]
                                             max_tokens=3, extra_body=GREEDY)
    assert r.choices[0].message is not None


def test_anthropic_refuses_a_tool_result_that_answers_no_call(agent: Agent) -> None:
    ask = {"role": "user", "content": "Weather in Paris?"}
    result = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}
    orphan = [ask, {"role": "assistant", "content": "I will check."}, result]
    earlier = [ask, {"role": "assistant", "content": [USE]},
               {"role": "user", "content": "hurry"}, {"role": "assistant", "content": "ok"},
               result]  # fmt: skip
    api = agent.anthropic.messages
    for msgs in (orphan, earlier):
        for call, kw in ((api.create, {"max_tokens": 3}), (api.count_tokens, {})):
            with pytest.raises(anthropic.BadRequestError) as err:
                call(model="default", messages=msgs, **kw)  # type: ignore[operator]
            assert err.value.status_code == 400
            assert "toolu_1" in str(err.value) and "answers no tool call" in str(err.value)
    good = [ask, {"role": "assistant", "content": [USE]}, result]
    r = agent.anthropic.messages.create(model="default", max_tokens=3, messages=good,  # type: ignore[arg-type]
                                        extra_body=GREEDY)
    assert r.content is not None


def test_responses_refuses_an_output_for_no_function_call(agent: Agent) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        agent.openai.responses.create(model="default", max_output_tokens=3, input=[
            {"role": "user", "content": "hi"},
            {"type": "function_call_output", "call_id": "c_nope", "output": "42"}])
    assert err.value.status_code == 400 and "c_nope" in str(err.value)
    assert "answers no tool call" in str(err.value)
    r = agent.openai.responses.create(model="default", max_output_tokens=3, input=[
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"}])
    assert r.status == "completed" or r.status == "incomplete"


def test_a_text_document_is_read_as_text_and_a_pdf_is_refused_for_what_it_is(
        agent: Agent) -> None:
    c = agent.anthropic
    doc = {"type": "document", "title": "Notes", "context": "from the wiki",
           "source": {"type": "text", "media_type": "text/plain",
                      "data": "Paris is the capital of France."}}  # fmt: skip
    same = [{"type": "text", "text": "Notes"}, {"type": "text", "text": "from the wiki"},
            {"type": "text", "text": "Paris is the capital of France."}]  # fmt: skip
    question = {"type": "text", "text": "What is the capital?"}
    as_doc = c.messages.count_tokens(model="default", messages=[
        {"role": "user", "content": [doc, question]}])  # type: ignore[list-item]
    as_text = c.messages.count_tokens(model="default", messages=[
        {"role": "user", "content": [*same, question]}])  # type: ignore[list-item]
    assert as_doc.input_tokens == as_text.input_tokens > 10
    blocks = dict(doc, source={"type": "content", "content": [
        {"type": "text", "text": "Paris is the capital of France."}]})
    as_blocks = c.messages.count_tokens(model="default", messages=[
        {"role": "user", "content": [blocks, question]}])  # type: ignore[list-item]
    assert as_blocks.input_tokens == as_doc.input_tokens
    r = c.messages.create(model="default", max_tokens=4, extra_body=GREEDY, messages=[
        {"role": "user", "content": [doc, question]}])  # type: ignore[list-item]
    assert r.usage.input_tokens > 10
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                          "data": "JVBERi0xLjQK"}}  # fmt: skip
    cited = dict(doc, citations={"enabled": True})
    for block, needle in ((pdf, "no PDF"), (cited, "citations are not supported")):
        with pytest.raises(anthropic.BadRequestError) as err:
            c.messages.create(model="default", max_tokens=4, messages=[
                {"role": "user", "content": [block, question]}])  # type: ignore[list-item]
        assert needle in str(err.value) and "image projector" not in str(err.value)
    # a document inside a tool result is read the same way
    r = c.messages.create(model="default", max_tokens=4, extra_body=GREEDY, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [USE]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [doc]}]}])  # type: ignore[list-item]
    assert r.content is not None
    assert httpx.get(f"{agent.base}/api/tags", timeout=10).status_code == 200


# --------------------------------------------------------------------------- pure translation


def test_translations_keep_results_that_answer_the_previous_calls() -> None:
    msgs = openai_messages([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [CALL, dict(CALL, id="call_2")]},
        {"role": "tool", "tool_call_id": "call_2", "content": "b"},
        {"role": "tool", "tool_call_id": "call_1", "content": "a"}])
    assert [(m["role"], m.get("tool_name")) for m in msgs] == [
        ("user", None), ("assistant", None), ("tool", "get_weather"), ("tool", "get_weather")]
    with pytest.raises(InvalidRequestError, match="answers no tool call"):
        openai_messages([{"role": "system", "content": "s"},
                         {"role": "tool", "tool_call_id": "x", "content": "a"}])
    body = messages_generate({"max_tokens": 3, "messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": [USE]},
        {"role": "system", "content": "a rule between (folded into the system prompt)"},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]})
    assert body["messages"][-1] == {"role": "tool", "content": "sunny",
                                    "tool_call_id": "toolu_1", "tool_name": "get_weather"}
    history = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "name": "f", "arguments": "{}"}]}]
    assert input_messages([{"type": "function_call_output", "call_id": "c0",
                            "output": "x"}], history)[0]["tool_name"] == "f"
    with pytest.raises(InvalidRequestError, match="'c9' answers no tool call"):
        input_messages([{"type": "function_call_output", "call_id": "c9", "output": "x"}],
                       history)

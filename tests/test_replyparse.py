"""Reply parser (pure): recorded replies of each family parse to the right content, thinking and
calls, and streaming them in any chunking gives exactly what the whole-reply parse gives."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from modeld.replyparse import (
    Event,
    ReplyParser,
    TextDelta,
    ThinkingDelta,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    fold,
    parse_reply,
)
from replyparse_cases import CASES, Case
from replyparse_util import check_event_order, random_chunks, shape


def stream(case: Case, chunks: list[str]) -> list[Event]:
    parser = ReplyParser(case.family, **case.opts)  # type: ignore[arg-type]
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish()
    assert [e.call for e in events if isinstance(e, ToolCallEnd)] == parser.calls
    return events


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_recorded_reply(case: Case) -> None:
    content, thinking, calls = parse_reply(case.family, case.text, **case.opts)
    assert content == case.content
    assert thinking == case.thinking
    assert [(c.name, json.loads(c.arguments)) for c in calls] == list(case.calls)
    assert [c.index for c in calls] == list(range(len(calls)))
    assert len({c.id for c in calls}) == len(calls)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_streaming_equals_whole_reply(case: Case) -> None:
    content, thinking, calls = parse_reply(case.family, case.text, **case.opts)
    chunkings = [[case.text], list(case.text)] + [random_chunks(case.text, s) for s in range(8)]
    for chunks in chunkings:
        events = stream(case, chunks)
        check_event_order(events)
        got_content, got_thinking, got_calls = fold(events)
        assert (got_content, got_thinking) == (content, thinking), chunks
        assert shape(got_calls) == shape(calls), chunks


def test_call_arguments_are_the_raw_text_the_model_wrote() -> None:
    text = '<tool_call>\n{"name": "f", "arguments":  {"b": 2,  "a": "é"}  }\n</tool_call>'
    _, _, calls = parse_reply("hermes", text, tools=True, thinking=False)
    assert calls[0].arguments == '{"b": 2,  "a": "é"}'


def test_text_before_a_call_flows_before_the_call_completes() -> None:
    parser = ReplyParser("hermes", tools=True, thinking=False)
    assert parser.feed("Let me check ") == [TextDelta("Let me check")]  # the space is held
    assert parser.feed("the weather.") == [TextDelta(" the weather.")]
    assert parser.feed("\n<tool") == []  # could be a marker
    assert parser.feed("_call>\n") == []
    events = parser.feed('{"name": "get_weather", "arg')
    assert events == [ToolCallStart(0, events[0].id, "get_weather")]  # type: ignore[union-attr]
    assert parser.feed('uments": {"city": "Par') == [ToolCallArgs(0, '{"city": "Par')]
    assert parser.feed('is"}}\n</tool_call>') == [
        ToolCallArgs(0, 'is"}'),
        ToolCallEnd(parser.calls[0]),
    ]
    assert parser.finish() == []
    assert parser.calls[0].arguments == '{"city": "Paris"}'


def test_held_marker_prefix_is_released_when_it_is_not_a_marker() -> None:
    for family, marker in (("hermes", "<tool_call>"), ("mistral", "[TOOL_CALLS]")):
        parser = ReplyParser(family, tools=True, thinking=False)
        prefix = marker[:-1]
        assert parser.feed("a " + prefix) == [TextDelta("a")]
        assert parser.feed("x and more") == [TextDelta(" " + prefix + "x and more")]


def test_prose_is_not_held_until_the_end() -> None:
    """The bug users report of Ollama (#9092): with tools on, content must stream."""
    for family in ("hermes", "llama3", "mistral", "generic"):
        parser = ReplyParser(family, tools=True, thinking=False)
        words = ["a", "b", "c", "d"]
        out = list(itertools.chain.from_iterable(parser.feed(w + " ") for w in words))
        assert fold(out)[0] == "a b c d"


def test_arguments_before_name_are_buffered_until_the_object_closes() -> None:
    parser = ReplyParser("generic", tools=True, thinking=False)
    assert parser.feed('{"arguments": {"x": 1}, ') == []
    assert parser.feed('"name": "f"') == []
    events = parser.feed("}")
    assert [type(e) for e in events] == [ToolCallStart, ToolCallArgs, ToolCallEnd]
    assert events[1] == ToolCallArgs(0, '{"x": 1}')


def test_abandoned_call_gives_its_text_back_and_its_index_is_reused() -> None:
    text = (
        '<tool_call>{"name": "f", "arguments": {"a": tru}}</tool_call>'
        '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    )
    parser = ReplyParser("hermes", tools=True, thinking=False)
    events = [e for ch in text for e in parser.feed(ch)] + parser.finish()
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [(s.index, s.name) for s in starts] == [(0, "f"), (0, "g")]
    assert starts[0].id != starts[1].id
    content, _, calls = fold(events)
    assert content == '<tool_call>{"name": "f", "arguments": {"a": tru}}</tool_call>'
    assert shape(calls) == [(0, "g", "{}")]


def test_unterminated_call_at_finish_is_text() -> None:
    parser = ReplyParser("mistral", tools=True, thinking=False)
    events = parser.feed('[TOOL_CALLS]f[ARGS]{"a": "b')
    assert [type(e) for e in events] == [ToolCallStart, ToolCallArgs]
    assert parser.finish() == [TextDelta('[TOOL_CALLS]f[ARGS]{"a": "b')]
    assert parser.calls == []


def test_thinking_streams_before_the_block_closes() -> None:
    parser = ReplyParser("hermes", tools=True, thinking=True)
    assert parser.feed("<thi") == []
    assert parser.feed("nk>\nStep one. ") == [ThinkingDelta("Step one.")]
    assert parser.feed("Step two.\n</thi") == [ThinkingDelta(" Step two.")]
    assert parser.feed("nk>\n\n  Answer") == [TextDelta("Answer")]
    assert parser.finish() == []


def test_thinking_not_at_the_start_stays_text() -> None:
    text = "Answer first. <think>late</think> more"
    assert parse_reply("hermes", text, tools=True, thinking=True) == (text, "", [])


@pytest.mark.parametrize("family", ["hermes", "llama3", "mistral", "generic"])
def test_forced_reply_is_calls_whatever_the_family(family: str) -> None:
    one = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    many = '{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]}'
    got = parse_reply(family, one, tools=True, thinking=False, forced=True)
    assert shape(got[2]) == [(0, "get_weather", '{"city": "Paris"}')] and got[0] == ""
    got = parse_reply(family, many, tools=True, thinking=False, forced=True)
    assert shape(got[2]) == [(0, "a", "{}"), (1, "b", '{"x": 1}')] and got[0] == ""
    thought = "<think>\nPick a tool.\n</think>\n\n" + one
    assert parse_reply(family, thought, tools=True, thinking=True, forced=True)[:2] == (
        "",
        "Pick a tool.",
    )


def test_forced_reply_that_is_not_a_call_is_given_back_as_text() -> None:
    text = '{"name": "f", "arguments": {"a": 1'  # cut off by max_tokens
    assert parse_reply("generic", text, tools=True, thinking=False, forced=True) == (text, "", [])


def test_unknown_family_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown tool-call family"):
        ReplyParser("qwen", tools=True, thinking=False)


def test_finish_twice_and_feed_after_finish() -> None:
    parser = ReplyParser("hermes", tools=True, thinking=False)
    parser.feed("hi <tool")
    assert parser.finish() == [TextDelta(" <tool")]
    assert parser.finish() == []
    with pytest.raises(RuntimeError):
        parser.feed("x")


def test_module_is_pure() -> None:
    code = (
        "import sys, modeld.replyparse\n"
        "bad = [m for m in ('llama_cpp', 'numpy', 'zmq', 'psutil', 'jinja2') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

"""Reply parser on random mixtures of markers, JSON pieces and prose (seeded): it never raises,
streaming in any chunking equals the whole-reply parse, every completed call's fragments add up
to its arguments, and a reply in which no call completes comes out as exactly its own text."""

from __future__ import annotations

import random

import pytest

from modeld.replyparse import FAMILIES, Event, ReplyParser, fold, parse_reply
from replyparse_util import check_event_order, random_chunks, shape

PIECES = [
    "<tool_call>", "</tool_call>", "<tool", "[TOOL_CALLS]", "[TOOL_", "[ARGS]", "[CALL_ID]",
    "<|python_tag|>", "<think>", "</think>", "<thi", "{", "}", "[", "]", ",", ":", ";", '"',
    "\\", '"name"', '"arguments"', '"parameters"', '"tool_calls"', '"id"', '"f"', '"x y"',
    "1", "true", "tru", "null", " ", "\n", "  \n", "hello", "Sure.", "é", "{}", '{"a": 1}',
    '{"name": "f", "arguments": {"a": [1, "}"]}}', '{"name": "g", "parameters": {}}',
    '[{"name": "h", "arguments": {"k": "v"}}]', "get_weather", "\t",
]  # fmt: skip


CALL = '{"name": "f", "arguments": {"a": [1, "}\\"]", {"b": null}]}}'
SKELETONS = [
    "Sure.\n<tool_call>\n" + CALL + "\n</tool_call>\n<tool_call>" + CALL + "</tool_call>",
    "<think>\nhm\n</think>\n\n<tool_call>\n" + CALL + "\n</tool_call>",
    '[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}, "id": "abcdefghi"}, ' + CALL + "]",
    'Ok.[TOOL_CALLS]f[ARGS]{"x": "]"}[TOOL_CALLS]g[CALL_ID]123456789[ARGS]{}',
    '<|python_tag|>{"name": "f", "parameters": {"x": 1}}; ' + CALL + "\n" + CALL,
    '{"tool_calls": [' + CALL + ", " + CALL + "]}",
    '{"tool_call": ' + CALL + "}",
    '{"arguments": {"q": "w"}, "id": 7, "name": "late"}',
]


def random_reply(rng: random.Random) -> str:
    """Random pieces, or a well-formed reply of some family with a few random edits."""
    if rng.random() < 0.5:
        return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))
    text = rng.choice(SKELETONS)
    for _ in range(rng.choice([0, 0, 1, 2])):
        at = rng.randrange(len(text) + 1)
        edit = rng.random()
        if edit < 0.3:
            text = text[:at] + text[at + 1 :]
        elif edit < 0.6:
            text = text[:at] + rng.choice(PIECES) + text[at:]
        else:
            text = text[:at]
    return text


def run(family: str, text: str, chunks: list[str], **opts: bool) -> list[Event]:
    parser = ReplyParser(family, tools=opts["tools"], thinking=opts["thinking"],
                         thinking_open=opts["thinking_open"], forced=opts["forced"])  # fmt: skip
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events + parser.finish()


@pytest.mark.parametrize("family", FAMILIES)
def test_random_replies(family: str) -> None:
    rng = random.Random(f"replyparse-{family}")
    for n in range(400):
        text = random_reply(rng)
        opts = {
            "tools": rng.random() < 0.9,
            "thinking": rng.random() < 0.3,
            "thinking_open": rng.random() < 0.1,
            "forced": rng.random() < 0.1,
        }
        content, thought, calls = parse_reply(family, text, **opts)
        if not calls and not opts["thinking"]:
            assert content == text, (text, opts)
        for chunks in (list(text), random_chunks(text, n), random_chunks(text, n + 1000)):
            events = run(family, text, chunks, **opts)
            check_event_order(events)
            got = fold(events)
            assert got[:2] == (content, thought), (text, chunks, opts)
            assert shape(got[2]) == shape(calls), (text, chunks, opts)

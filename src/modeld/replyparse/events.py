"""What the reply parser produces: finished tool calls and the streaming events that lead to them.

Why a module of its own: the runner, the daemon and the HTTP layer all consume these shapes, and
none of them should need the parser's internals to do so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ParsedCall:
    """One completed tool call.

    ``index``: 0, 1, … in order of appearance in the reply. ``id``: made by the parser
    (``call_`` + 24 hex digits, OpenAI style; an id the model wrote, as Mistral's do, is ignored).
    ``arguments``: the JSON text of the arguments object exactly as the model wrote it (without
    surrounding whitespace); it is checked to parse as a JSON object.
    """

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class TextDelta:
    """Reply text (content) that is certainly not part of a tool call or of thinking."""

    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    """Text of the model's thinking block, without the ``<think>`` tags."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A call began and its name is known. A Start never followed by its End was abandoned
    (the call turned out malformed; its raw text then came as a TextDelta)."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgs:
    """Raw JSON text of a call's arguments; the fragments of one call concatenate to exactly
    the ``arguments`` of its ToolCallEnd."""

    index: int
    fragment: str


@dataclass(frozen=True)
class ToolCallEnd:
    """The call is complete and valid."""

    call: ParsedCall


Event = TextDelta | ThinkingDelta | ToolCallStart | ToolCallArgs | ToolCallEnd

#: Makes a tool call id; tests pass a deterministic one.
IdMaker = Callable[[], str]


def new_call_id() -> str:
    """An OpenAI-style call id: ``call_`` and 24 random hex digits."""
    return "call_" + os.urandom(12).hex()  # what secrets.token_hex does, without OpenSSL


class CallLog:
    """The completed calls of one reply, and the index/id handed to the call being parsed.

    An abandoned call's index is handed to the next call, so completed calls are always
    numbered 0, 1, … without gaps.
    """

    def __init__(self, make_id: IdMaker = new_call_id) -> None:
        self.calls: list[ParsedCall] = []
        self._make_id = make_id

    def begin(self) -> tuple[int, str]:
        """Index and id for a call that is starting."""
        return len(self.calls), self._make_id()

    def complete(self, index: int, call_id: str, name: str, arguments: str) -> ParsedCall:
        call = ParsedCall(index=index, id=call_id, name=name, arguments=arguments)
        self.calls.append(call)
        return call


def coalesce(events: list[Event]) -> list[Event]:
    """Merge neighbouring text, thinking and same-call argument deltas (fewer, larger events;
    the text is unchanged). Empty deltas are dropped."""
    out: list[Event] = []
    for event in events:
        if isinstance(event, TextDelta | ThinkingDelta | ToolCallArgs):
            text = event.fragment if isinstance(event, ToolCallArgs) else event.text
            if not text:
                continue
            last = out[-1] if out else None
            if isinstance(event, TextDelta) and isinstance(last, TextDelta):
                out[-1] = TextDelta(last.text + event.text)
                continue
            if isinstance(event, ThinkingDelta) and isinstance(last, ThinkingDelta):
                out[-1] = ThinkingDelta(last.text + event.text)
                continue
            if (
                isinstance(event, ToolCallArgs)
                and isinstance(last, ToolCallArgs)
                and last.index == event.index
            ):
                out[-1] = ToolCallArgs(event.index, last.fragment + event.fragment)
                continue
        out.append(event)
    return out

"""Helpers of the reply parser tests: chunkings, call shapes and the streaming event checks."""

from __future__ import annotations

import json
import random
import re

from modeld.replyparse import Event, ParsedCall, ToolCallArgs, ToolCallEnd, ToolCallStart


def random_chunks(text: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    chunks, i = [], 0
    while i < len(text):
        n = rng.randint(1, 12)
        chunks.append(text[i : i + n])
        i += n
    return chunks


def shape(calls: list[ParsedCall]) -> list[tuple[int, str, str]]:
    return [(c.index, c.name, c.arguments) for c in calls]


def check_event_order(events: list[Event]) -> None:
    """Start, then Args fragments, then End, per call; fragments concatenate to the arguments."""
    open_calls: dict[int, tuple[str, list[str]]] = {}
    for event in events:
        if isinstance(event, ToolCallStart):
            assert re.fullmatch(r"call_[0-9a-f]{24}", event.id)
            open_calls[event.index] = (event.id, [])  # an abandoned call's index is reused
        elif isinstance(event, ToolCallArgs):
            open_calls[event.index][1].append(event.fragment)
        elif isinstance(event, ToolCallEnd):
            call_id, fragments = open_calls.pop(event.call.index)
            assert event.call.id == call_id
            assert "".join(fragments) == event.call.arguments
            assert isinstance(json.loads(event.call.arguments), dict)
            assert event.call.arguments == event.call.arguments.strip()

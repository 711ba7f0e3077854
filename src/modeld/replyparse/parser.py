"""The reply parser: a model's streamed text in, content, thinking and tool-call events out.

Why streaming: text must reach the client as soon as it is certainly not the start of a tool-call
marker (holding the whole reply back is what Ollama users report as ollama#9092 / #12557), and a
call's arguments should flow while the model writes them.
"""

from __future__ import annotations

from modeld.replyparse.events import (
    CallLog,
    Event,
    IdMaker,
    ParsedCall,
    TextDelta,
    ThinkingDelta,
    ToolCallEnd,
    coalesce,
    new_call_id,
)
from modeld.replyparse.families import (
    GenericStage,
    HermesStage,
    Llama3Stage,
    MistralStage,
    PlainStage,
)
from modeld.replyparse.stage import Stage
from modeld.replyparse.templates import FAMILIES
from modeld.replyparse.thinking import ThinkingSplitter

_STAGES: dict[str, type[Stage]] = {
    "hermes": HermesStage,
    "llama3": Llama3Stage,
    "mistral": MistralStage,
    "generic": GenericStage,
}


class ReplyParser:
    """Feed the generated text as it comes; each call returns the events it completes.

    ``tools``: tool calls may appear (else all content is text). ``thinking``: split a leading
    ``<think>…</think>`` into ThinkingDelta (else the tags stay in the text). ``thinking_open``:
    the prompt already opened the block, so the reply starts inside it. ``forced``: the reply is
    a grammar-forced call object in the generic shape, whatever the family.

    A call that turns out malformed (bad JSON, no string name, arguments not an object, never
    closed) is not a call: its raw text comes out as TextDelta, possibly after its ToolCallStart
    and ToolCallArgs were sent (a Start without End is abandoned; its index is reused).
    Nothing raises on model output, and no text is lost except whitespace around calls and
    thinking tags.
    """

    def __init__(
        self,
        family: str,
        *,
        tools: bool,
        thinking: bool,
        thinking_open: bool = False,
        forced: bool = False,
        make_id: IdMaker = new_call_id,
    ) -> None:
        if family not in FAMILIES:
            raise ValueError(f"unknown tool-call family {family!r} (known: {', '.join(FAMILIES)})")
        self._log = CallLog(make_id)
        stage: type[Stage] = GenericStage if forced else _STAGES[family]
        self._stage = stage(self._log) if tools or forced else PlainStage(self._log)
        self._thinking = ThinkingSplitter(start_open=thinking_open) if thinking else None
        self._finished = False

    def feed(self, text: str) -> list[Event]:
        """Events that ``text`` (the next piece of the reply) completes, in order."""
        if self._finished:
            raise RuntimeError("feed after finish")
        if self._thinking is None:
            return coalesce(self._stage.feed(text))
        thought, content = self._thinking.feed(text)
        events: list[Event] = [ThinkingDelta(thought)]
        events += self._stage.feed(content)
        return coalesce(events)

    def finish(self) -> list[Event]:
        """Flush at the end of generation: held text, and any unterminated call as text."""
        if self._finished:
            return []
        self._finished = True
        events: list[Event] = []
        if self._thinking is not None:
            thought, content = self._thinking.finish()
            events.append(ThinkingDelta(thought))
            events += self._stage.feed(content)
        events += self._stage.finish()
        return coalesce(events)

    @property
    def calls(self) -> list[ParsedCall]:
        """All completed calls so far."""
        return list(self._log.calls)


def fold(events: list[Event]) -> tuple[str, str, list[ParsedCall]]:
    """(content, thinking, calls) of a list of events."""
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    thought = "".join(e.text for e in events if isinstance(e, ThinkingDelta))
    calls = [e.call for e in events if isinstance(e, ToolCallEnd)]
    return content, thought, calls


def parse_reply(
    family: str,
    text: str,
    *,
    tools: bool,
    thinking: bool,
    thinking_open: bool = False,
    forced: bool = False,
) -> tuple[str, str, list[ParsedCall]]:
    """Whole-reply convenience: (content, thinking, calls), the same as streaming gives."""
    parser = ReplyParser(
        family, tools=tools, thinking=thinking, thinking_open=thinking_open, forced=forced
    )
    return fold(parser.feed(text) + parser.finish())

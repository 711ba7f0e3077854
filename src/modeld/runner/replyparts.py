"""The parts of a reply as a runner sends them: text, or (through the reply parser) thinking
and tool calls, gathered into chunks; and OpenAI's per-token logprobs. A mixin of
:class:`modeld.runner.batch.BatchEngine` (its ``host`` sends, its ``llm`` detokenizes)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import llama_cpp

from modeld import replyparse
from modeld import runnerwire as rp
from modeld.replies import ToolCallDone

if TYPE_CHECKING:
    from modeld.runner.streams import Host, Stream


class ReplyParts:
    host: Host
    llm: llama_cpp.Llama

    def _text(self, stream: Stream, out: str) -> None:
        """New reply text: content, or through the parser into thinking and tool calls."""
        if stream.parser is None:
            stream.unsent += out
            return
        for event in stream.parser.feed(out):
            self._event(stream, event)

    def _event(self, stream: Stream, event: replyparse.Event) -> None:
        """One parsed piece; a chunk keeps the reply's order (thinking, text, calls), so a
        piece of an earlier kind first sends what is pending."""
        if isinstance(event, replyparse.ThinkingDelta):
            if stream.unsent or stream.unsent_calls:
                self.flush(stream, time.perf_counter())
            stream.unsent_thinking += event.text
        elif isinstance(event, replyparse.TextDelta):
            if stream.unsent_calls:
                self.flush(stream, time.perf_counter())
            stream.unsent += event.text
        elif isinstance(event, replyparse.ToolCallStart):
            stream.unsent_calls.append({"index": event.index, "id": event.id,
                                        "name": event.name, "arguments": ""})  # fmt: skip
        elif isinstance(event, replyparse.ToolCallArgs):
            last = stream.unsent_calls[-1] if stream.unsent_calls else None
            if last is not None and last["index"] == event.index:
                last["arguments"] += event.fragment
            else:
                stream.unsent_calls.append({"index": event.index, "arguments": event.fragment})
        elif isinstance(event, replyparse.ToolCallEnd):
            stream.calls.append(event.call)
            stream.unsent_done.append(call_done(event.call))

    def flush(self, stream: Stream, now: float) -> None:
        """Send what is pending of ``stream``'s reply as one chunk."""
        if not (stream.unsent or stream.unsent_thinking or stream.unsent_calls
                or stream.unsent_logprobs or stream.unsent_done):
            return
        self.host.send(rp.chunk(stream.rid, stream.unsent, stream.completion,
                                thinking=stream.unsent_thinking, tool_calls=stream.unsent_calls,
                                calls_done=stream.unsent_done,
                                logprobs=stream.unsent_logprobs))  # fmt: skip
        stream.unsent, stream.unsent_thinking, stream.last_send = "", "", now
        stream.unsent_calls, stream.unsent_logprobs, stream.unsent_done = [], [], []

    def _logprob(self, stream: Stream, token: int) -> dict[str, Any]:
        """OpenAI's logprobs entry of a sampled token (texts, bytes, alternatives)."""
        entry = stream.state.logprobs(token, stream.spec.sampling.top_logprobs)

        def text(tok: int) -> tuple[str, list[int]]:
            raw = self.llm.detokenize([tok])
            return raw.decode("utf-8", errors="replace"), list(raw)

        tok_text, tok_bytes = text(token)
        out: dict[str, Any] = {"token": tok_text, "logprob": entry["logprob"],
                               "bytes": tok_bytes}  # fmt: skip
        if "top" in entry:
            out["top_logprobs"] = [{"token": t, "logprob": lp, "bytes": b}
                                   for (t, b), lp in ((text(i), lp) for i, lp in entry["top"])]
        return out


def call_done(call: replyparse.ToolCall) -> ToolCallDone:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}

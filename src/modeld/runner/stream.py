"""One generate request on one sequence of the batch engine (:mod:`modeld.runner.batch`):
its prompt still to evaluate, its sampler, and its reply as it is sent (content, thinking and
tool calls in their order, in chunks, then its ``done`` message). The engine decides when a
request ends; what its reply says then is the stream's own.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import llama_cpp._internals
import numpy as np

from modeld import replyparse
from modeld.model import probe
from modeld.runner import specs, speculate
from modeld.runner.generation import PromptState
from modeld.runner.prompting import Media
from modeld.runner.promptplan import Piece, Span
from modeld.runner.sampling import Grammar
from modeld.runner.textstream import TextStream
from modeld.wire import runnerwire as rp
from modeld.wire.replies import RunnerGenerateDone, ToolCallDone

Send = Callable[[Mapping[str, Any]], None]


@dataclass(eq=False)
class Stream:
    """One request on one sequence: its prompt still to evaluate, its sampler and its text."""

    spec: specs.GenerateSpec
    state: PromptState
    prompt: list[int]
    sampler: llama_cpp._internals.LlamaSampler
    text: TextStream
    strip_lead: bool
    t0: float
    todo: deque[Piece] = field(default_factory=deque)
    reused: int = 0
    next_token: int | None = None  # sampled, to be decoded in the next step
    completion: int = 0
    t_first: float | None = None
    unsent: str = ""
    last_send: float = 0.0
    finish: str = "length"
    context_full: bool = False  # it ended because its sequence's cells ran out
    prompt_tokens: int = 0  # the request's prompt (``prompt`` also holds a resumed reply)
    written: list[int] = field(default_factory=list)  # the reply's tokens (to resume it)
    resume_next: int | None = None  # a resumed reply's token to decode once ``prompt`` is in
    batched_max: int = 1  # the most sequences whose tokens shared a decode with this one's
    grammar: Grammar | None = None  # the reply's constraint (a format, a forced tool call)
    parser: replyparse.ReplyParser | None = None  # finds thinking and tool calls in the text
    unsent_thinking: str = ""
    unsent_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI-style deltas
    unsent_logprobs: list[dict[str, Any]] = field(default_factory=list)
    unsent_done: list[ToolCallDone] = field(default_factory=list)  # calls complete since
    calls: list[replyparse.ParsedCall] = field(default_factory=list)
    preserve: frozenset[int] = frozenset()  # special tokens whose text the parser needs
    media: Media | None = None  # the prompt's images (issue 38)
    # span start -> the image's embeddings, or why it could not be encoded (the request ends
    # with that when it reaches the image: batch.py)
    encoded: dict[int, np.ndarray[Any, Any] | Exception] = field(default_factory=dict)
    drafter: speculate.Drafter | None = None  # its prompt-lookup drafts (verify.py)

    def release(self) -> None:
        """Free the prompt's images not freed yet (an encoded one was, by its encoding)."""
        if self.media is not None:
            self.media.free()

    @property
    def rid(self) -> str:
        return self.spec.rid

    @property
    def seq(self) -> int:
        return self.state.seq

    @property
    def spans(self) -> tuple[Span, ...]:
        """Where the prompt's images are (each a piece of its own)."""
        return tuple(self.media.spans) if self.media is not None else ()

    def feed(self, llm: llama_cpp.Llama, send: Send, token: int) -> None:
        """One more token of the reply: its text through stop strings and the parser."""
        self.completion += 1
        self.written.append(token)
        out = self.text.feed(llm.detokenize([token], special=token in self.preserve))
        if self.strip_lead and out:  # the reply need not start with the space after "Answer:"
            out = out.lstrip()
            self.strip_lead = not out
        if out:
            self.text_out(send, out)

    def logprob(self, llm: llama_cpp.Llama, token: int) -> dict[str, Any]:
        """OpenAI's logprobs entry of a sampled token (texts, bytes, alternatives)."""
        entry = self.state.logprobs(token, self.spec.sampling.top_logprobs)

        def text(tok: int) -> tuple[str, list[int]]:
            raw = llm.detokenize([tok])
            return raw.decode("utf-8", errors="replace"), list(raw)

        tok_text, tok_bytes = text(token)
        out: dict[str, Any] = {"token": tok_text, "logprob": entry["logprob"],
                               "bytes": tok_bytes}  # fmt: skip
        if "top" in entry:
            out["top_logprobs"] = [{"token": t, "logprob": lp, "bytes": b}
                                   for (t, b), lp in ((text(i), lp) for i, lp in entry["top"])]
        return out

    def text_out(self, send: Send, out: str) -> None:
        """New reply text: content, or through the parser into thinking and tool calls."""
        if self.parser is None:
            self.unsent += out
            return
        for event in self.parser.feed(out):
            self.event(send, event)

    def event(self, send: Send, event: replyparse.Event) -> None:
        """One parsed piece; a chunk keeps the reply's order (thinking, text, calls), so a
        piece of an earlier kind first sends what is pending."""
        if isinstance(event, replyparse.ThinkingDelta):
            if self.unsent or self.unsent_calls:
                self.flush(send, time.perf_counter())
            self.unsent_thinking += event.text
        elif isinstance(event, replyparse.TextDelta):
            if self.unsent_calls:
                self.flush(send, time.perf_counter())
            self.unsent += event.text
        elif isinstance(event, replyparse.ToolCallStart):
            self.unsent_calls.append({"index": event.index, "id": event.id,
                                      "name": event.name, "arguments": ""})  # fmt: skip
        elif isinstance(event, replyparse.ToolCallArgs):
            last = self.unsent_calls[-1] if self.unsent_calls else None
            if last is not None and last["index"] == event.index:
                last["arguments"] += event.fragment
            else:
                self.unsent_calls.append({"index": event.index, "arguments": event.fragment})
        elif isinstance(event, replyparse.ToolCallEnd):
            self.calls.append(event.call)
            self.unsent_done.append(call_done(event.call))

    def flush(self, send: Send, now: float) -> None:
        """Send what is pending of the reply as one chunk."""
        if not (self.unsent or self.unsent_thinking or self.unsent_calls
                or self.unsent_logprobs or self.unsent_done):
            return
        send(rp.chunk(self.rid, self.unsent, self.completion, thinking=self.unsent_thinking,
                      tool_calls=self.unsent_calls, calls_done=self.unsent_done,
                      logprobs=self.unsent_logprobs))  # fmt: skip
        self.unsent, self.unsent_thinking, self.last_send = "", "", now
        self.unsent_calls, self.unsent_logprobs, self.unsent_done = [], [], []

    def draft_counts(self) -> dict[str, int] | None:
        """What its prompt-lookup drafting did, for its ``done`` (None: it never drafted)."""
        return self.drafter.counts.as_dict() if self.drafter is not None else None

    def finish_reply(self, send: Send) -> RunnerGenerateDone:
        """Send what the reply still holds (text kept for a stop string, the parser's tail),
        then return its ``done`` message: why it ended, its usage and its timings."""
        t_end = time.perf_counter()
        tail = self.text.finish()
        if tail:
            self.text_out(send, tail)
        if self.parser is not None:
            for event in self.parser.finish():
                self.event(send, event)
        self.flush(send, t_end)
        if self.text.stopped:
            self.finish = "stop"
        if self.calls:
            self.finish = "tool_calls"
        first = self.t_first if self.t_first is not None else t_end
        return rp.done_generate(
            self.rid,
            finish_reason=self.finish,
            length_reason=("context_window" if self.context_full else "max_tokens")
            if self.finish == "length" else None,
            prompt_tokens=self.prompt_tokens,
            prompt_tokens_reused=self.reused,
            completion_tokens=self.completion,
            prompt_eval_s=first - self.t0,
            generation_s=t_end - first,
            batched_max=self.batched_max,
            memory=probe.own_memory(),
            tool_calls=[call_done(c) for c in self.calls],
            stop_sequence=self.text.stop_hit,
            drafts=self.draft_counts(),
        )


def call_done(call: replyparse.ParsedCall) -> ToolCallDone:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}

"""A reply that runs out of context goes on in a larger one (issue 36).

The prompt side grows the context before a prompt is evaluated; a reply can still reach the end
of its cells (an agent asks for up to 32,000 tokens). When the request allows it (``grow``: the
daemon knows a larger context is possible), the runner stops that reply without ending it: it
sends what is ready and the tokens written so far (:func:`pause`), keeps the sequence's cells,
and the daemon reloads the model with a larger context, the cells carried over by the handoff
(runner/handoff.py). The same request comes back with ``resume``; :func:`admit` replays those
tokens through the stop strings, the reply parser, the grammar and the sampler's history
without sending them (the client has them), then decodes on from the restored cells.

Greedy replies come out as in a context large enough from the start (the restored cells are
bitwise those of the evaluation, and the token that did not fit is decoded as it would have
been). A sampled reply's random draws start again from its seed after the growth. Without the
handoff (prompt cache off, RPC workers) the prompt and reply are evaluated again instead. A
prompt with images does not grow this way (it ends with ``context_window``): its image cells
would be planned again as text on the way back.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import llama_cpp

from modeld.model import probe
from modeld.wire import runnerwire as rp

if TYPE_CHECKING:
    from modeld.runner.stream import Stream


class Send(Protocol):
    def send(self, msg: Mapping[str, Any]) -> None: ...


class Engine(Protocol):
    """What a resumed reply needs of :class:`modeld.runner.batch.BatchEngine`."""

    streams: list[Stream]
    n_ctx_seq: int
    llm: llama_cpp.Llama

    @property
    def host(self) -> Send: ...

    def end(self, stream: Stream, reply: Mapping[str, Any]) -> None: ...

    def done(self, stream: Stream) -> None: ...


def pause(engine: Engine, stream: Stream) -> None:
    """End ``stream`` for now: what is ready goes out (text held for a stop string or a
    half-written tool call waits for the continuation, which replays it), then its tokens."""
    now = time.perf_counter()
    stream.flush(engine.host.send, now)
    first = stream.t_first if stream.t_first is not None else now
    engine.end(stream, rp.done_generate(
        stream.rid, finish_reason="length", length_reason="context_window",
        prompt_tokens=stream.prompt_tokens, prompt_tokens_reused=stream.reused,
        completion_tokens=stream.completion, prompt_eval_s=first - stream.t0,
        generation_s=now - first, batched_max=stream.batched_max, memory=probe.own_memory(),
        resume=stream.written, drafts=stream.draft_counts(),
    ))  # fmt: skip


def admit(engine: Engine, stream: Stream) -> None:
    """Continue the reply ``stream.spec.resume`` began; ``stream.prompt`` holds the prompt and
    all but its last token (the one that found no cell)."""
    written = stream.spec.resume
    for token in written:
        stream.feed(engine.llm, engine.host.send, token)
        if stream.grammar is not None:
            stream.grammar.accept(token)
        llama_cpp.llama_sampler_accept(stream.sampler.sampler, token)
    stream.unsent, stream.unsent_thinking = "", ""  # the client has all that
    stream.unsent_calls, stream.unsent_done = [], []
    stream.t_first = time.perf_counter()
    engine.streams.append(stream)
    target, state = stream.prompt, stream.state
    if len(target) + 1 >= engine.n_ctx_seq:  # no larger context came: it ends here
        stream.context_full = True
        engine.done(stream)
        return
    if state.tokens == target:  # the cells the handoff restored
        stream.reused, stream.next_token = len(target), written[-1]
        return
    prepared, todo = state.begin(target, stream.spec.sampling.greedy)
    stream.reused, stream.todo = prepared.reused, deque(todo)
    if todo:
        stream.resume_next = written[-1]
    else:
        state.drop_logits()
        stream.next_token = written[-1]

"""One generation's HTTP reply, whichever API asked: what the four APIs share, in one place.

Each API supplies a :class:`Renderer` (its shapes: a stream's opening ``head``, a ``chunk``, the
``done``, an in-stream ``error``, the ``whole`` reply read to its end, its HTTP error); this
module owns the rest:

- read whole (the runner asked with ``stream`` false: fewer, larger chunks) or streamed;
- the first-byte rule (:func:`committed`): an error before the stream's first byte is an HTTP
  status (a wrong model name is a 404, not a 200 stream carrying an error), after it an error
  in the stream. A stream counts as started once its first bytes were *handed on* (after the
  ``yield``), never when they were merely made: until then an HTTP status is still possible;
- keep-alives while the daemon is silent (:mod:`modeld.http.ticks`), for the APIs that send them;
- a client that leaves cancels its request: the bridge's session watches for the disconnect
  while the route waits, and closing a stream closes the daemon's reply stream, which cancels it;
- the rules about a reply's content: at most one tool call when the request asks for one
  (:attr:`Renderer.one_call`), and the thinking joined into the ``done`` for the renderer.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from starlette.responses import Response, StreamingResponse

from modeld.errors import ModeldError
from modeld.http.bridge import Bridge
from modeld.http.ticks import SSE_KEEPALIVE, ticking


class Renderer(ABC):
    """An API's shapes of one generation's reply. Set ``one_call`` when the request allows one
    tool call only (the reply then carries the first); ``ticks`` false for a stream that sends
    no keep-alives (Ollama's NDJSON has none)."""

    media_type = "text/event-stream"
    ticks = True
    one_call = False

    def head(self) -> list[bytes]:
        """What opens a stream (sent with its first reply, or at its first keep-alive)."""
        return []

    def tick(self) -> bytes:
        """A keep-alive: sent after each stretch of silence (none right after one already
        sent in the same step: a head may end with one)."""
        return SSE_KEEPALIVE

    @abstractmethod
    def chunk(self, body: dict[str, Any]) -> list[bytes]:
        """A chunk of the stream (its text, thinking, tool call deltas, logprobs)."""

    @abstractmethod
    def done(self, text: str, done: dict[str, Any]) -> list[bytes]:
        """The stream's end: ``text`` is the whole reply, ``done`` the daemon's done body."""

    @abstractmethod
    def error(self, exc: ModeldError) -> list[bytes]:
        """An error once the stream has started (its status is already sent)."""

    @abstractmethod
    def whole(self, text: str, done: dict[str, Any]) -> Response:
        """The reply read to its end (``done`` with ``thinking`` and ``logprobs`` whole)."""

    @abstractmethod
    def http_error(self, exc: ModeldError) -> Response:
        """An error before anything was sent, in the API's shape and with its status."""


async def generation(bridge: Bridge, body: dict[str, Any], renderer: Renderer,
                     stream: bool) -> Response:
    """Generate ``body`` (with its ``model``) and answer as ``renderer`` shapes it."""
    if not stream:
        try:
            text, done = await collect(bridge, body, renderer.one_call)
        except ModeldError as exc:
            return renderer.http_error(exc)
        return renderer.whole(text, done)
    parts = committed(_steps(bridge, body, renderer), renderer.error)
    return await stream_or_error(parts, renderer.media_type, renderer.http_error)


class _Reply:
    """What a reply's chunks add up to, with the content rules applied to each."""

    def __init__(self, one_call: bool, logprobs: bool) -> None:
        self.one_call, self.keep_logprobs = one_call, logprobs
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.logprobs: list[Any] = []

    def chunk(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """``body`` as the client may see it (None: nothing is left of it to show)."""
        self.text.append(str(body.get("text") or ""))
        self.thinking.append(str(body.get("thinking") or ""))
        if self.keep_logprobs:
            self.logprobs.extend(body.get("logprobs") or [])
        calls = body.get("tool_calls")
        if not (self.one_call and calls):
            return body
        kept = [d for d in calls if d["index"] == 0]
        if len(kept) == len(calls):
            return body
        rest = {k: v for k, v in body.items() if k != "tool_calls"}
        if kept:
            return {**rest, "tool_calls": kept}
        return rest if any(rest.get(k) for k in ("text", "thinking", "logprobs")) else None

    def done(self, done: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(the whole text, ``done`` with the whole ``thinking`` and ``logprobs`` when there
        were any, and its ``tool_calls`` cut to the first when only one is allowed)."""
        done = dict(done)
        if any(self.thinking):
            done["thinking"] = "".join(self.thinking)
        if self.logprobs:
            done["logprobs"] = self.logprobs
        if self.one_call and done.get("tool_calls"):
            done["tool_calls"] = done["tool_calls"][:1]
        return "".join(self.text), done


async def collect(bridge: Bridge, body: dict[str, Any], one_call: bool = False
                  ) -> tuple[str, dict[str, Any]]:
    """A generation read to its end: (the whole text, the ``done`` body: :meth:`_Reply.done`).
    Asked with ``stream`` false: its runner sends fewer, larger chunks."""
    reply = _Reply(one_call, logprobs=True)
    done: dict[str, Any] = {}
    async with bridge.session() as s:
        async for kind, msg in s.stream("generate", **{**body, "stream": False}):
            if kind == "chunk":
                reply.chunk(msg)
            else:
                done = msg
    return reply.done(done)


#: What the bridge yields, ticks included: ("chunk" | "done", body), or None after silence.
Step = tuple[str, dict[str, Any]] | None


async def _steps(bridge: Bridge, body: dict[str, Any], r: Renderer
                 ) -> AsyncGenerator[list[bytes], None]:
    """The daemon's replies to ``body``, with keep-alives where ``r`` sends them, rendered."""
    async with bridge.session() as s, aclosing(s.stream("generate", **body)) as replies:
        source: AsyncGenerator[Step, None] = ticking(replies) if r.ticks else replies
        async with aclosing(source), aclosing(rendered(source, r)) as steps:
            async for out in steps:
                yield out


async def rendered(items: AsyncIterator[Step], r: Renderer
                   ) -> AsyncGenerator[list[bytes], None]:
    """The stream's bytes, a list per reply or keep-alive; the head with the first of them."""
    reply = _Reply(r.one_call, logprobs=False)
    opened = False
    async for item in items:
        out = [] if opened else r.head()
        opened = True
        if item is None:  # silence: the prompt is still being evaluated
            if out[-1:] != [keep := r.tick()]:
                out.append(keep)
        elif item[0] == "chunk":
            shown = reply.chunk(item[1])
            if shown is not None:
                out += r.chunk(shown)
        else:
            out += r.done(*reply.done(item[1]))
        yield out


async def committed(steps: AsyncIterator[list[bytes]],
                    error: Callable[[ModeldError], list[bytes]]) -> AsyncGenerator[bytes, None]:
    """``steps`` flattened, with the first-byte rule: a :class:`ModeldError` before the first
    byte was handed on is raised (:func:`stream_or_error` answers it with its HTTP status),
    one after it is sent as ``error`` renders it."""
    sent = False
    try:
        async for out in steps:
            for part in out:
                yield part
                sent = True
    except ModeldError as exc:
        if not sent:
            raise
        for part in error(exc):
            yield part
    finally:
        close = getattr(steps, "aclose", None)
        if close is not None:  # the client left: stop the source now, not when collected
            await close()


async def stream_or_error(body: AsyncIterator[bytes], media_type: str,
                          error: Callable[[ModeldError], Response]) -> Response:
    """Stream ``body``; an error before its first piece is answered with its HTTP status
    instead (a wrong model name is a 404, not a 200 stream carrying an error)."""
    try:
        first = await anext(body)
    except StopAsyncIteration:
        first = b""
    except ModeldError as exc:
        return error(exc)

    async def rest() -> AsyncIterator[bytes]:
        yield first
        async for part in body:
            yield part

    return StreamingResponse(rest(), media_type=media_type)


def ndjson(doc: dict[str, Any]) -> bytes:
    """One line of an NDJSON stream (Ollama's replies and pull progress)."""
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"

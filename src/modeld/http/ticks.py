"""Early bytes: a stream that says something while the daemon is still silent.

A long prompt (an agent's 20k-token first turn: ~50 s on 2 cores) or a model load keeps the
daemon's first reply away for a long time, and clients and proxies give up on a connection that
sends nothing (not even headers). :func:`ticking` wraps the daemon's replies and adds a tick
(``None``) after :data:`FIRST_BYTES_S` of silence before the first reply and after each
:data:`PING_S` of silence later: the route then commits to its stream (headers and its opening
events: Anthropic's ``message_start``, Responses' ``response.created``) and sends a keep-alive
(Anthropic's ``ping`` event, an SSE comment elsewhere). An error within the first
:data:`FIRST_BYTES_S` (an unknown model, a prompt over the context) is still an HTTP status;
a later one is an error event in the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

#: Silence before the first reply after which the stream starts anyway (headers, opening events):
#: long enough for the daemon's own refusals (an unknown model, no room: milliseconds) to stay
#: HTTP statuses, short enough that an agent sees its stream open at once (issue 47: 1 s was
#: a second added to every turn's first byte).
FIRST_BYTES_S = 0.25
#: Silence after which a keep-alive is sent (and again after each such stretch).
PING_S = 5.0
#: An SSE comment: every SSE reader skips it (OpenAI's SDK, Codex, browsers' EventSource).
SSE_KEEPALIVE = b": keep-alive\n\n"

T = TypeVar("T")


async def ticking(
    replies: AsyncIterator[T], first_s: float = FIRST_BYTES_S, every_s: float = PING_S
) -> AsyncGenerator[T | None, None]:
    """``replies`` as they come, with ``None`` after ``first_s`` of silence before the first
    and after each ``every_s`` of silence since. Closing this closes ``replies`` (a request
    still running is then cancelled by the bridge)."""
    pending: asyncio.Future[T] | None = None
    wait = first_s
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(replies))
            done, _ = await asyncio.wait({pending}, timeout=wait)
            wait = every_s
            if not done:
                yield None
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:  # the client left or the route stopped reading: stop the wait
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        close = getattr(replies, "aclose", None)
        if close is not None:
            await close()

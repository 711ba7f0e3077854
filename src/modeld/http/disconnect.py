"""Noticing that an HTTP client went away while its request waits on the daemon.

Starlette watches for a disconnect only while a streaming response is being sent. Before that
(a non-streaming request, or a stream still in prompt evaluation, before its first token) the
route is just awaiting the daemon, and a client that left was found out only when the whole
reply was ready to write: the generation ran on, holding a slot (issue 21, item 3).

:class:`Watch` (ASGI middleware) makes each request's ``receive`` available to the bridge through
a context variable; :func:`watcher` turns it into a task that ends when ``http.disconnect``
arrives, and the bridge races every wait on the daemon against it. The request is then cancelled
at the daemon, which stops the runner within one decode step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from typing import Any

from modeld.errors import CancelledError

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The current HTTP request's ``receive`` (None outside a request: the bridge then just waits).
RECEIVE: ContextVar[Receive | None] = ContextVar("modeld_http_receive", default=None)


class ClientGone(CancelledError):
    """The HTTP client disconnected; its request was cancelled at the daemon."""

    def __init__(self) -> None:
        super().__init__("the HTTP client disconnected; its request was cancelled")


class Watch:
    """ASGI middleware: publish each HTTP request's ``receive`` in :data:`RECEIVE`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = RECEIVE.set(receive)
        try:
            await self.app(scope, receive, send)
        finally:
            RECEIVE.reset(token)


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass  # body parts are read by the route before it calls the daemon; nothing else comes


def watcher() -> asyncio.Task[None] | None:
    """A task that ends when the current HTTP request's client disconnects (None outside
    one). Start it only once the route has read the body: it consumes ``receive``."""
    receive = RECEIVE.get()
    if receive is None:
        return None
    return asyncio.ensure_future(_until_disconnect(receive))


async def unless_gone(work: Awaitable[Any], gone: asyncio.Task[None] | None) -> Any:
    """``await work``, or raise :class:`ClientGone` (``work`` cancelled) when ``gone`` ends
    first."""
    if gone is None:
        return await work
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientGone()


def stop(gone: asyncio.Task[None] | None) -> None:
    if gone is not None and not gone.done():
        gone.cancel()

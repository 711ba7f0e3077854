"""The HTTP side's client of the daemon: the same protocol v1 requests the CLI sends.

The daemon's event loop stays the one owner of state: every HTTP request becomes one or more
ZeroMQ requests on the daemon's socket, so keep-alive, eviction, queueing, context growth,
errors and stats behave exactly as for the CLI. Each HTTP request has a DEALER of its own while
it runs, on the asyncio flavour of pyzmq so the HTTP event loop never blocks. A DEALER whose
requests all ended is kept for the next HTTP request (at most :data:`IDLE_SOCKETS`, for
:data:`IDLE_S`): a new one cost ~0.5 ms a request here (the socket, its connect, the daemon's
handshake on it, the close); one that had to cancel a request is closed, so no late reply can
reach another conversation. A quiet daemon holds no kept sockets (nor their descriptors).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import zmq
import zmq.asyncio

from modeld.errors import DaemonUnavailableError
from modeld.http import disconnect
from modeld.http.disconnect import ClientGone, unless_gone
from modeld.wire import protocol
from modeld.wire.replyflow import ReplyStream

#: Silence from the daemon this long (no chunk, no done) is answered with an error.
REPLY_TIMEOUT_S = 3600.0
#: Connected DEALERs kept for the next HTTP requests (more run at once: opened and closed).
IDLE_SOCKETS = 8
#: Seconds a kept DEALER waits for the next HTTP request before it is closed: a burst, or a
#: client's next request straight after its last, reuses it.
IDLE_S = 2.0


class Conversation:
    """One HTTP request's conversation with the daemon."""

    def __init__(self, sock: zmq.asyncio.Socket, prefix: str,
                 gone: asyncio.Task[None] | None = None) -> None:
        self.sock = sock
        self._ids = itertools.count(1)
        self._prefix = prefix
        self.gone = gone  # ends when the HTTP client disconnects (disconnect.watcher)
        self._open = 0  # requests sent and not ended
        self._cancelled = False  # a request was cancelled: replies to it may still come

    async def send(self, type_: str, **body: Any) -> str:
        rid = f"{self._prefix}-{next(self._ids)}"
        self._open += 1
        await self.sock.send_multipart(protocol.encode(protocol.request(type_, rid, **body)))
        return rid

    async def recv(self, replies: ReplyStream) -> tuple[str, dict[str, Any]]:
        """The next chunk or the done of ``replies``' request (an error reply raised)."""
        while True:  # a client that leaves meanwhile raises ClientGone (a CancelledError)
            if self.gone is not None and self.gone.done():
                raise ClientGone()
            try:  # a reply already here (a done right behind its chunk) is taken at once
                frames = await self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                if not await unless_gone(self.sock.poll(int(REPLY_TIMEOUT_S * 1000)),
                                         self.gone):  # fmt: skip
                    raise DaemonUnavailableError("no reply from the daemon",
                                                 hint="check the daemon log") from None
                continue
            data = protocol.reply_object(frames)
            try:
                reply = replies.feed(data)
            finally:
                if replies.finished:  # its done or its error came
                    self._open -= 1
            if reply is not None:
                return reply

    async def call(self, type_: str, **body: Any) -> dict[str, Any]:
        """A request answered by one ``done`` (its body), or its typed error raised."""
        async for kind, reply in self.stream(type_, **body):
            if kind == "done":
                return reply
        raise AssertionError("unreachable: a stream ends with its done or raises")

    async def stream(self, type_: str, **body: Any
                     ) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
        """("chunk", {text}) ... then ("done", body); an error reply is raised. Leaving early
        (the HTTP client went away) cancels the request at once, not at the next token."""
        replies = ReplyStream(await self.send(type_, **body))
        try:
            while not replies.finished:
                yield await self.recv(replies)
        finally:
            if not replies.finished:
                self._cancel(replies.request_id)

    @property
    def settled(self) -> bool:
        """Every request sent has ended and none was cancelled: the socket may serve another
        conversation."""
        return self._open == 0 and not self._cancelled

    def _cancel(self, rid: str) -> None:
        """Cancel ``rid`` at the daemon; no await: this runs while the task is cancelled."""
        self._cancelled = True
        with contextlib.suppress(zmq.ZMQError):
            self.sock.send_multipart(
                protocol.encode(protocol.request("cancel", f"{rid}-x", target=rid)), zmq.NOBLOCK
            )


_Kept = tuple[zmq.asyncio.Socket, float]


def _expire(idle: list[_Kept], loop: asyncio.AbstractEventLoop) -> None:
    """Close the kept sockets that waited :data:`IDLE_S` (the clock's resolution allowed)."""
    while idle and loop.time() - idle[0][1] >= IDLE_S - 0.01:
        idle.pop(0)[0].close()


class Bridge:
    """Opens :class:`Conversation` s with the daemon at ``endpoint``."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.ctx = zmq.asyncio.Context()
        self._n = itertools.count(1)
        # by event loop (an asyncio socket serves the loop it was first used on): the kept
        # sockets, oldest first, with the loop time each was kept at
        self._idle: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_Kept]]
        self._idle = weakref.WeakKeyDictionary()

    def _socket(self, idle: list[_Kept]) -> zmq.asyncio.Socket:
        if idle:
            return idle.pop()[0]
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 500)  # a final cancel still reaches the daemon
        sock.connect(self.endpoint)
        return sock

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Conversation]:
        idle = self._idle.setdefault(asyncio.get_running_loop(), [])
        sock = self._socket(idle)
        gone = disconnect.watcher()
        talk = Conversation(sock, f"http-{os.getpid():x}-{next(self._n)}", gone)
        try:
            yield talk
        finally:
            disconnect.stop(gone)
            if talk.settled and len(idle) < IDLE_SOCKETS and not sock.closed:
                loop = asyncio.get_running_loop()
                idle.append((sock, loop.time()))
                loop.call_later(IDLE_S, _expire, idle, loop)
            else:
                sock.close()

    async def call(self, type_: str, **body: Any) -> dict[str, Any]:
        async with self.session() as s:
            return await s.call(type_, **body)

    def close(self) -> None:
        self.ctx.destroy(linger=0)

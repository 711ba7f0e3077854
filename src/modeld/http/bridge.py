"""The HTTP side's client of the daemon: the same protocol v1 requests the CLI sends.

The daemon's event loop stays the one owner of state: every HTTP request becomes one or more
ZeroMQ requests on the daemon's socket, so keep-alive, eviction, queueing, context growth,
errors and stats behave exactly as for the CLI. One DEALER per HTTP request (an ipc connect costs
microseconds), on the asyncio flavour of pyzmq so the HTTP event loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import zmq
import zmq.asyncio

from modeld.errors import DaemonUnavailableError
from modeld.http import disconnect
from modeld.http.disconnect import unless_gone
from modeld.wire import protocol
from modeld.wire.replyflow import ReplyStream

#: Silence from the daemon this long (no chunk, no done) is answered with an error.
REPLY_TIMEOUT_S = 3600.0


class Conversation:
    """One HTTP request's conversation with the daemon."""

    def __init__(self, sock: zmq.asyncio.Socket, prefix: str,
                 gone: asyncio.Task[None] | None = None) -> None:
        self.sock = sock
        self._ids = itertools.count(1)
        self._prefix = prefix
        self.gone = gone  # ends when the HTTP client disconnects (disconnect.watcher)

    async def send(self, type_: str, **body: Any) -> str:
        rid = f"{self._prefix}-{next(self._ids)}"
        await self.sock.send_multipart(protocol.encode(protocol.request(type_, rid, **body)))
        return rid

    async def recv(self, replies: ReplyStream) -> tuple[str, dict[str, Any]]:
        """The next chunk or the done of ``replies``' request (an error reply raised)."""
        while True:  # a client that leaves meanwhile raises ClientGone (a CancelledError)
            if not await unless_gone(self.sock.poll(int(REPLY_TIMEOUT_S * 1000)), self.gone):
                raise DaemonUnavailableError("no reply from the daemon",
                                             hint="check the daemon log")
            data = protocol.reply_object(await self.sock.recv_multipart())
            if (reply := replies.feed(data)) is not None:
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

    def _cancel(self, rid: str) -> None:
        """Cancel ``rid`` at the daemon; no await: this runs while the task is cancelled."""
        with contextlib.suppress(zmq.ZMQError):
            self.sock.send_multipart(
                protocol.encode(protocol.request("cancel", f"{rid}-x", target=rid)), zmq.NOBLOCK
            )


class Bridge:
    """Opens :class:`Conversation` s with the daemon at ``endpoint``."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.ctx = zmq.asyncio.Context()
        self._n = itertools.count(1)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Conversation]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 500)  # a final cancel still reaches the daemon
        sock.connect(self.endpoint)
        gone = disconnect.watcher()
        try:
            yield Conversation(sock, f"http-{os.getpid():x}-{next(self._n)}", gone)
        finally:
            disconnect.stop(gone)
            sock.close()

    async def call(self, type_: str, **body: Any) -> dict[str, Any]:
        async with self.session() as s:
            return await s.call(type_, **body)

    def close(self) -> None:
        self.ctx.destroy(linger=0)


"""Time limits and a per-client cap for the front door's connections (slow clients, slowloris).

uvicorn (0.54, h11) reads a request's headers and body without a time limit (its one timer is
the keep-alive one, after a response), and its ``limit_concurrency`` answers 503 to everyone
once slow connections fill it. So the front door runs uvicorn with :class:`GuardedH11`, its h11
protocol with these rules added:

- a request's head (request line and headers) must be complete within
  ``http_header_timeout_s`` of the connection, or of the previous response on a kept-alive one;
- its body within ``http_body_timeout_s`` plus one second per :data:`MIN_BODY_RATE` bytes
  received (a client sending at least that fast is never cut);
- a client address has at most ``http_client_connections`` connections sending a request
  (head or body) at once; one more closes its oldest, so slow connections cannot crowd out a
  new request (on loopback every local client shares the address 127.0.0.1).

A connection past its limit gets a 408 (429 when crowded out) and is closed; a request whose
body was being read sees the client leave. On a non-loopback bind the API key is checked as
soon as the head is complete (:mod:`.security`), and a refused connection is closed at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from modeld.config import Settings

log = logging.getLogger("modeld.http")

#: Bytes per second of a request body that keep extending its time limit (1 s per 16 KiB).
MIN_BODY_RATE = 16 * 1024
#: Seconds a connection cut at its limit stays half-closed so its answer arrives.
LINGER_S = 1.0


@dataclass
class Limits:
    """The rules, and the connections of each client address still sending a request (oldest
    first); shared by every connection (all on the front door's one event loop)."""

    header_s: float
    body_s: float
    per_client: int
    reading: dict[str, OrderedDict[GuardedH11, None]] = field(default_factory=dict)
    closed: dict[str, int] = field(default_factory=lambda: {"header": 0, "body": 0,
                                                            "crowded": 0})  # fmt: skip

    def track(self, conn: GuardedH11) -> None:
        """``conn`` is sending a request now; a client over its cap loses its oldest one."""
        mine = self.reading.setdefault(conn.peer, OrderedDict())
        mine[conn] = None
        while len(mine) > self.per_client:
            oldest = next(iter(mine))
            oldest.expire("crowded")  # leaves the table through untrack

    def untrack(self, conn: GuardedH11) -> None:
        mine = self.reading.get(conn.peer)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.reading[conn.peer]


_REASONS = {
    "header": (408, "the request's headers did not arrive within {header_s:g} s"),
    "body": (408, "the request's body did not arrive within {body_s:g} s (plus 1 s per 16 KiB "
                  "received)"),
    "crowded": (429, "too many connections from your address are sending requests at once "
                     "(at most {per_client})"),
}  # fmt: skip


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the time limits and the per-client cap of :class:`Limits`
    (given by :func:`protocol_class`)."""

    limits: Limits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peer = "?"
        self.phase: str | None = None  # "header" or "body" while a request is being sent
        self.since = 0.0
        self.body_bytes = 0
        self.timer: asyncio.TimerHandle | None = None
        self.expired = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.peer = str(self.client[0]) if self.client else "?"
        self.enter("header")

    def data_received(self, data: bytes) -> None:
        if self.expired:
            return  # answered and closing: what it still sends is dropped
        if self.phase == "body":
            self.body_bytes += len(data)
        super().data_received(data)
        self.follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.follow()  # kept alive: the next request's head is awaited

    def follow(self) -> None:
        """The phase h11 says the client is in: sending a head (idle), a body, or neither."""
        state = self.conn.their_state
        if self.transport.is_closing():
            self.leave()
        elif state is h11.IDLE:
            if self.phase != "header":
                self.enter("header")
        elif state is h11.SEND_BODY:
            if self.phase != "body":
                self.enter("body")
        else:
            self.leave()  # the request is all here: served without a time limit

    def connection_lost(self, exc: Exception | None) -> None:
        self.leave()
        super().connection_lost(exc)

    def enter(self, phase: str) -> None:
        self.phase, self.since, self.body_bytes = phase, self.loop.time(), 0
        self.limits.track(self)
        self.arm(self.deadline())

    def leave(self) -> None:
        self.phase = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.limits.untrack(self)

    def deadline(self) -> float:
        if self.phase == "body":
            return self.since + self.limits.body_s + self.body_bytes / MIN_BODY_RATE
        return self.since + self.limits.header_s

    def arm(self, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(when, self.check)

    def check(self) -> None:
        self.timer = None
        if self.phase is None:
            return
        if self.loop.time() < (when := self.deadline()):
            self.arm(when)  # the body kept arriving: its limit moved on
        else:
            self.expire(self.phase)

    def expire(self, reason: str) -> None:
        """Answer 408 (429 when crowded out) unless a response has started, and close."""
        self.leave()
        self.limits.closed[reason] += 1
        status, text = _REASONS[reason]
        message = text.format(header_s=self.limits.header_s, body_s=self.limits.body_s,
                              per_client=self.limits.per_client)  # fmt: skip
        log.debug("closing a connection from %s: %s", self.peer, message)
        cycle = self.cycle
        if cycle is None or not cycle.response_started:
            body = json.dumps({"error": message}).encode()
            phrase = "Request Timeout" if status == 408 else "Too Many Requests"
            self.transport.write(
                f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
        if cycle is not None:
            cycle.disconnected = True  # the request's app sees the client leave, sends nothing
            cycle.message_event.set()
        self.expired = True
        # A close with the client's bytes unread resets the connection, and the client may
        # lose the answer: half-close, drop what still comes, close for good a moment later.
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def protocol_class(settings: Settings) -> type[GuardedH11]:
    """:class:`GuardedH11` with this daemon's limits (uvicorn's ``http=`` takes a class)."""
    limits = Limits(settings.http_header_timeout_s, settings.http_body_timeout_s,
                    settings.http_client_connections)  # fmt: skip
    return type("GuardedH11", (GuardedH11,), {"limits": limits})

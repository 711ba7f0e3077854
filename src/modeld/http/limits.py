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

Two rules act when a connection opens, before it can send anything:

- a "client" on loopback is the local user who owns the connecting socket (:mod:`.peers`),
  not its address: every local client shares 127.0.0.1, and any process can pick among
  127.x.y.z, so neither one user's flood nor its 40 idle connections crowd out another user;
- on a loopback front door another local user than the daemon's (and root) is answered 403
  and closed unless ``http_users`` lets them in (``key``: they then need the api_key, as
  everyone does once one is set; ``all``);
- at most ``total`` connections are open at once (:func:`.fds.http_cap`, so HTTP never takes
  the descriptors libzmq needs): one more closes a connection already answered and closing,
  else the oldest idle one of the client holding the most, else it is refused with a 503.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from modeld.config import Settings
from modeld.http import fds
from modeld.http.peers import is_loopback_peer, peer_uid
from modeld.settingvalues import is_loopback

log = logging.getLogger("modeld.http")

#: Bytes per second of a request body that keep extending its time limit (1 s per 16 KiB).
MIN_BODY_RATE = 16 * 1024
#: Seconds a connection cut at its limit stays half-closed so its answer arrives.
LINGER_S = 1.0


#: Users served on a loopback front door by default: the daemon's own and root (who can
#: reach the daemon's private socket anyway).
OWNERS = frozenset({os.geteuid(), 0}) if hasattr(os, "geteuid") else frozenset()
#: Whether the kernel says who a loopback peer is (elsewhere every local user is let in).
UIDS_KNOWN = sys.platform.startswith("linux")


@dataclass
class Limits:
    """The rules, every open connection and, by client, the connections still sending a
    request (oldest first); shared by every connection (all on the front door's one event
    loop)."""

    header_s: float
    body_s: float
    per_client: int
    total: int = 1 << 20
    strangers: str = "all"  # http_users on a loopback door: owner, key or all
    reading: dict[str, OrderedDict[GuardedH11, None]] = field(default_factory=dict)
    live: OrderedDict[GuardedH11, None] = field(default_factory=OrderedDict)
    closed: dict[str, int] = field(default_factory=lambda: {
        "header": 0, "body": 0, "crowded": 0, "full": 0, "user": 0})  # fmt: skip

    def track(self, conn: GuardedH11) -> None:
        """``conn`` is sending a request now; a client over its cap loses its oldest one."""
        mine = self.reading.setdefault(conn.key, OrderedDict())
        mine[conn] = None
        while len(mine) > self.per_client:
            oldest = next(iter(mine))
            oldest.expire("crowded")  # leaves the table through untrack

    def untrack(self, conn: GuardedH11) -> None:
        mine = self.reading.get(conn.key)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.reading[conn.key]

    def admit(self, conn: GuardedH11) -> str | None:
        """Count ``conn`` as open, making room when the front door is full; why it is refused
        instead ("user", "full"), or None."""
        while len(self.live) >= self.total:
            victim = self._victim()
            if victim is None:
                return "full"
            victim.expire("full", linger=False)
            self.live.pop(victim, None)
        self.live[conn] = None  # a refused user's too: it lingers, and counts meanwhile
        return "user" if conn.stranger and self.strangers == "owner" else None

    def _victim(self) -> GuardedH11 | None:
        """A connection to close for a new one: one already answered and closing, else of the
        client with the most connections sending a request, the oldest that has sent nothing
        of it (idle), else its oldest."""
        for conn in self.live:
            if conn.expired:
                return conn
        if not self.reading:
            return None
        most = max(self.reading.values(), key=len)  # the oldest that has sent nothing yet
        return next((c for c in most if not c.heard), next(iter(most)))

    def closed_for_good(self, conn: GuardedH11) -> None:
        self.live.pop(conn, None)


_REASONS = {
    "header": (408, "the request's headers did not arrive within {header_s:g} s"),
    "body": (408, "the request's body did not arrive within {body_s:g} s (plus 1 s per 16 KiB "
                  "received)"),
    "crowded": (429, "too many connections from your address are sending requests at once "
                     "(at most {per_client})"),
    "full": (503, "the daemon has too many HTTP connections open (at most {total}); try again"),
    "user": (403, "forbidden: this daemon's HTTP API serves only the user running it (uid "
                  "{uid}) on loopback; its owner can set http_users = all (or key, with an "
                  "api_key) to let other local users in"),
}  # fmt: skip
_PHRASES = {403: "Forbidden", 408: "Request Timeout", 429: "Too Many Requests",
            503: "Service Unavailable"}


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the time limits and the per-client cap of :class:`Limits`
    (given by :func:`protocol_class`)."""

    limits: Limits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peer = "?"
        self.key = "?"  # the client its per-client cap counts: a uid on loopback, else an address
        self.stranger = False  # another local user than the daemon's (on a loopback door)
        self.phase: str | None = None  # "header" or "body" while a request is being sent
        self.since = 0.0
        self.body_bytes = 0
        self.heard = False  # a byte of the request it is sending has come
        self.timer: asyncio.TimerHandle | None = None
        self.expired = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.peer = self.key = str(self.client[0]) if self.client else "?"
        peer, local = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
        if UIDS_KNOWN and is_loopback_peer(peer) and local:
            uid = peer_uid(peer, local)  # once per connection (~0.1 ms), never per request
            self.key = f"uid {uid}" if uid is not None else self.key
            self.stranger = uid not in OWNERS
        refusal = self.limits.admit(self)
        if refusal is not None:
            self.expire(refusal, linger=refusal == "user")
            return
        self.enter("header")

    def data_received(self, data: bytes) -> None:
        if self.expired:
            return  # answered and closing: what it still sends is dropped
        self.heard = True
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
        self.limits.closed_for_good(self)
        super().connection_lost(exc)

    def enter(self, phase: str) -> None:
        self.phase, self.since, self.body_bytes = phase, self.loop.time(), 0
        self.heard = phase == "body"
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

    def expire(self, reason: str, linger: bool = True) -> None:
        """Answer 408 (429 crowded out, 503 full, 403 another user) unless a response has
        started, and close: at once when the descriptor is needed now (``linger`` false)."""
        self.leave()
        self.limits.closed[reason] += 1
        if self.expired:  # answered already and closing: now at once
            self.transport.abort()
            return
        status, text = _REASONS[reason]
        message = text.format(header_s=self.limits.header_s, body_s=self.limits.body_s,
                              per_client=self.limits.per_client, total=self.limits.total,
                              uid=os.geteuid())  # fmt: skip
        log.debug("closing a connection from %s (%s): %s", self.peer, self.key, message)
        cycle = self.cycle
        if cycle is None or not cycle.response_started:
            body = json.dumps({"error": message}).encode()
            self.transport.write(
                f"HTTP/1.1 {status} {_PHRASES[status]}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
        if cycle is not None:
            cycle.disconnected = True  # the request's app sees the client leave, sends nothing
            cycle.message_event.set()
        self.expired = True
        # A close with the client's bytes unread resets the connection, and the client may
        # lose the answer: half-close, drop what still comes, close for good a moment later.
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def protocol_class(settings: Settings) -> type[GuardedH11]:
    """:class:`GuardedH11` with this daemon's limits (uvicorn's ``http=`` takes a class)."""
    address = settings.http_address
    loopback = address is None or is_loopback(address[0])
    limits = Limits(settings.http_header_timeout_s, settings.http_body_timeout_s,
                    settings.http_client_connections,
                    fds.http_cap(settings.http_connections, fds.current_limit()),
                    settings.http_users if loopback and UIDS_KNOWN else "all")  # fmt: skip
    return type("GuardedH11", (GuardedH11,), {"limits": limits})

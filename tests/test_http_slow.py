"""Slow HTTP clients (issue 35, finding 12) against a real daemon's front door: request heads
and bodies sent a byte at a time are cut (408) at their time limits, a client's connections
still sending requests are capped (the oldest gets a 429), a stream and plain requests beside
them keep being served, the daemon's memory returns to its level, and on a non-loopback bind
a request without the key is answered and its connection closed at once."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agentutil import answers, free_port
from daemonutil import until

Factory = Callable[..., Any]
HEAD = b"GET /api/tags HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 4000
BODY_HEAD = (b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
             b"\r\nContent-Length: 4000\r\n\r\n")  # fmt: skip
DRIP_S = 0.25  # one byte per connection this often: 4 bytes/s


class Slow:
    """One raw connection that sends its request a byte at a time and never finishes."""

    def __init__(self, port: int, body: bool) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setblocking(False)
        self.opened = time.monotonic()
        self.closed: float | None = None
        self.reply = b""
        self.body = body
        if body:
            self.sock.sendall(BODY_HEAD)  # the head at once: only the body is slow
        self.todo = memoryview(b'{"model": "default", "prompt": "' + b"x" * 3900 if body else HEAD)

    def step(self) -> None:
        if self.closed is not None:
            return
        try:
            while chunk := self.sock.recv(65536):
                self.reply += chunk
            self._close()  # b"": the server closed it
            return
        except BlockingIOError:
            pass
        except OSError:
            self._close()
            return
        try:
            self.sock.send(self.todo[:1])
            self.todo = self.todo[1:]
        except BlockingIOError:
            pass
        except OSError:
            self._close()

    def _close(self) -> None:
        self.closed = time.monotonic()
        self.sock.close()

    @property
    def status(self) -> int | None:
        return int(self.reply.split(b" ", 2)[1]) if self.reply.startswith(b"HTTP/1.1 ") else None


def drip(conns: list[Slow], until_s: float) -> None:
    end = time.monotonic() + until_s
    while time.monotonic() < end and any(c.closed is None for c in conns):
        for c in conns:
            c.step()
        time.sleep(DRIP_S)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Beside:
    """A streamed generation and plain requests, timed, while the slow clients run."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.chunks: list[float] = []
        self.latencies: list[float] = []
        self.statuses: list[int] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._stream), threading.Thread(target=self._poll)]

    def __enter__(self) -> Beside:
        for t in self.threads:
            t.start()
        until(lambda: len(self.chunks) > 2, timeout=120, what="the stream's first tokens")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(180)

    def _stream(self) -> None:
        body = {"model": "default", "prompt": "Once upon a time", "stream": True,
                "options": {"num_predict": 400, "temperature": 0, "seed": 1}}  # fmt: skip
        while not self.stop.is_set():
            with httpx.stream("POST", f"{self.base}/api/generate", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    self.chunks.append(time.monotonic())
                    if json.loads(line).get("done") or self.stop.is_set():
                        break
            self.chunks.append(float("nan"))  # a new stream: no gap counted across

    def _poll(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            self.statuses.append(httpx.get(f"{self.base}/api/tags", timeout=30).status_code)
            self.latencies.append(time.monotonic() - t0)
            time.sleep(0.2)

    def max_gap(self) -> float:
        gaps = [b - a for a, b in zip(self.chunks, self.chunks[1:], strict=False)
                if a == a and b == b]  # fmt: skip
        return max(gaps)


def _start(daemon_factory: Factory, *, conns: int, host: str = "127.0.0.1",
           env: dict[str, str] | None = None) -> tuple[Any, int]:
    port = free_port()
    d = daemon_factory("--http", f"{host}:{port}", env={
        "MODELD_HTTP_HEADER_TIMEOUT": "2", "MODELD_HTTP_BODY_TIMEOUT": "2",
        "MODELD_HTTP_CLIENT_CONNECTIONS": str(conns), **(env or {})})
    until(lambda: answers(port) or _refuses(port), timeout=30, what="the HTTP front door")
    return d, port


def _refuses(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 401
    except httpx.HTTPError:
        return False


def test_slow_heads_and_bodies_are_cut_at_their_limits_and_others_are_served(
        daemon_factory: Factory, default_model: Path) -> None:
    d, port = _start(daemon_factory, conns=200)
    base = f"http://127.0.0.1:{port}"
    httpx.post(f"{base}/api/generate", json={"model": "default", "prompt": "hi",
                                             "options": {"num_predict": 2}}, timeout=120)
    before = rss(d.proc.pid)
    with Beside(base) as beside:
        conns = [Slow(port, body=i % 4 == 0) for i in range(60)]  # 45 heads, 15 bodies
        drip(conns, until_s=15)
    assert all(c.closed is not None for c in conns), "a slow connection was held open"
    for c in conns:
        held = c.closed - c.opened  # type: ignore[operator]
        assert c.status == 408, c.reply[:200]
        assert 2.0 - 0.1 <= held <= 2.0 + 6.0, held  # its limit, plus drip and a loaded box's slack
        assert (b"body" if c.body else b"headers") in c.reply
    # beside them: every plain request answered quickly, the stream never paused long
    assert beside.statuses and set(beside.statuses) == {200}
    # generous bounds (a loaded 2-core box pauses anything ~1-3 s); a door that waited on the
    # slow clients would hold these for their limits one after another (60 x 2 s)
    assert max(beside.latencies) < 5.0, max(beside.latencies)
    assert beside.max_gap() < 5.0, beside.max_gap()
    until(lambda: rss(d.proc.pid) < before + 30 * 2**20, timeout=20,
          what="the daemon's memory back at its level")  # fmt: skip
    assert "Traceback" not in d.log_text()


def test_a_client_crowding_the_door_loses_its_oldest_connections(
        daemon_factory: Factory, default_model: Path) -> None:
    _, port = _start(daemon_factory, conns=16)
    base = f"http://127.0.0.1:{port}"
    with Beside(base) as beside:
        conns = []
        for _ in range(100):  # more than the cap, from the same address as the others
            conns.append(Slow(port, body=False))
            for c in conns:
                c.step()
        drip(conns, until_s=15)
        # a new request from that same address is still served
        assert httpx.get(f"{base}/api/tags", timeout=10).status_code == 200
    crowded = [c for c in conns if c.status == 429]
    timed_out = [c for c in conns if c.status == 408]
    assert len(crowded) >= 100 - 16 and len(crowded) + len(timed_out) == 100
    assert all(c.closed is not None for c in conns)
    assert b"at most 16" in crowded[0].reply
    assert set(beside.statuses) == {200} and max(beside.latencies) < 5.0  # as above
    assert beside.max_gap() < 5.0


def test_beyond_loopback_a_request_without_the_key_is_closed_at_once(
        daemon_factory: Factory) -> None:
    _, port = _start(daemon_factory, conns=32, host="0.0.0.0",
                     env={"MODELD_API_KEY": "s3cret"})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /api/generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n"
                  b"Content-Length: 1000000\r\n\r\n")  # a body it never sends
        reply = b""
        while chunk := s.recv(65536):  # EOF: the server closed the connection
            reply += chunk
        took = time.monotonic() - t0
    assert reply.startswith(b"HTTP/1.1 401") and b"connection: close" in reply.lower()
    assert took < 10.0, took  # not the body's time limit (2 s + 1 s per 16 KiB: ~63 s)
    slow = Slow(port, body=False)  # and a slow head is cut as on loopback
    drip([slow], until_s=10)
    assert slow.status == 408
    with_key = httpx.get(f"http://127.0.0.1:{port}/api/tags", timeout=10,
                         headers={"Authorization": "Bearer s3cret"})
    assert with_key.status_code == 200

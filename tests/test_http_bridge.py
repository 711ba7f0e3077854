"""The HTTP side's DEALERs against a real daemon: one whose requests all ended serves the next
HTTP request; one that cancelled a request is closed, and the next request gets a socket (and
replies) of its own; kept ones are closed after IDLE_S without a request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from daemonutil import until
from modeld.http import bridge as bridge_module
from modeld.http.bridge import IDLE_SOCKETS, Bridge


def test_a_settled_socket_is_kept_and_a_cancelling_one_closed(
    daemon_factory: Callable[..., Any], tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bridge_module, "IDLE_S", 1.0)
    d = daemon_factory()
    d.client(timeout=120).load(str(tiny_model), n_ctx=256)

    async def talk() -> None:
        bridge = Bridge(d.endpoint)
        try:
            async with bridge.session() as s:
                first = s.sock
                assert (await s.call("ping"))["pong"] is True
            async with bridge.session() as s:
                assert s.sock is first  # kept: no new socket, connect or handshake
                done = await s.call("generate", model=str(tiny_model), prompt="hi",
                                    options={"max_tokens": 2, "temperature": 0})  # fmt: skip
                assert done["usage"]["completion_tokens"] == 2, done
            async with bridge.session() as s:
                assert s.sock is first
                stream = s.stream("generate", model=str(tiny_model), prompt="tell a story",
                                  options={"max_tokens": 200, "temperature": 0})  # fmt: skip
                assert (await anext(stream))[0] == "chunk"
                await stream.aclose()  # left after one reply: the request is cancelled
            assert first.closed  # a late reply to it can reach no one
            async with bridge.session() as s:
                assert s.sock is not first
                assert (await s.call("ping"))["pong"] is True
            kept = [bridge.session() for _ in range(IDLE_SOCKETS + 2)]
            talks = [await k.__aenter__() for k in kept]
            for t in talks:
                await t.call("ping")
            for k in kept:
                await k.__aexit__(None, None, None)
            idle = bridge._idle[asyncio.get_running_loop()]
            assert len(idle) == IDLE_SOCKETS  # the others were closed
            held = [sock for sock, _ in idle]
            await asyncio.sleep(1.5)  # IDLE_S without a request: closed, descriptors freed
            assert not idle and all(sock.closed for sock in held)
        finally:
            bridge.close()

    asyncio.run(talk())
    # the story's cancel reached the daemon before its socket closed (LINGER)
    until(lambda: d.client().stats()["in_flight"] == 0, timeout=30, what="the cancel")

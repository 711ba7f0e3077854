"""The cluster's placement policy (pure: modeld.cluster.placement) and the in-process ASGI run
the nodes use (modeld.cluster.asgi); neither needs Ray."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from modeld.cluster import asgi
from modeld.cluster.placement import (
    EVICTS_IDLE,
    FITS,
    HOLDS,
    WAITS,
    NodeView,
    choose,
    least_loaded,
    rank,
    round_robin,
)


def test_the_node_that_holds_the_model_wins_even_when_busier() -> None:
    views = [NodeView("n0", plan="admit"), NodeView("n1", plan="loaded", running=3, queued=2)]
    got = choose(views)
    assert got is not None and (got.node, got.rank) == ("n1", HOLDS)


def test_a_model_being_sent_counts_as_held_before_the_daemon_reports_it() -> None:
    # two first requests for one model: the second follows the first, it is not loaded twice
    views = [NodeView("n0", plan="admit"), NodeView("n1", plan="admit", sent=1, sent_for_model=1)]
    got = choose(views)
    assert got is not None and got.node == "n1" and got.rank == HOLDS


def test_fitting_beats_evicting_idle_beats_waiting_for_busy() -> None:
    fits, evicts, waits = (NodeView("c", plan="admit", running=5),
                           NodeView("a", plan="evict", would_evict=("x",)),
                           NodeView("b", plan="wait"))
    assert choose([fits, evicts, waits]).node == "c"  # type: ignore[union-attr]
    assert choose([evicts, waits]).node == "a"  # type: ignore[union-attr]
    assert choose([waits]).node == "b"  # type: ignore[union-attr]
    assert [rank(v) for v in (fits, evicts, waits)] == [FITS, EVICTS_IDLE, WAITS]


def test_within_a_rank_the_least_loaded_then_fewer_victims_then_the_name() -> None:
    views = [NodeView("a", plan="evict", would_evict=("x", "y")),
             NodeView("b", plan="evict", would_evict=("z",), queued=1),
             NodeView("c", plan="evict", would_evict=("z",))]
    assert choose(views).node == "c"  # type: ignore[union-attr]
    assert choose(views[:2]).node == "a"  # type: ignore[union-attr]
    # the ingress's own count of requests sent counts when the daemon has not seen them yet
    same = [NodeView("a", plan="admit", sent=2), NodeView("b", plan="admit", running=1)]
    assert choose(same).node == "b"  # type: ignore[union-attr]


@pytest.mark.parametrize("view", [
    NodeView("n", up=False, plan="loaded"),
    NodeView("n", plan="refuse"),
    NodeView("n", plan=None, error="no model named x"),
])
def test_down_refusing_or_unknowing_nodes_are_never_chosen(view: NodeView) -> None:
    assert rank(view) is None
    assert choose([view]) is None


def test_the_reason_names_the_rank_and_the_victims() -> None:
    got = choose([NodeView("n", plan="evict", would_evict=("x", "y"), running=1)])
    assert got is not None and got.reason == "evicts idle models (x, y), 1 request(s) there"


def test_least_loaded_and_round_robin_skip_nodes_that_are_down() -> None:
    views = [NodeView("b", running=2), NodeView("a", running=3), NodeView("c", up=False)]
    assert least_loaded(views) == "b"
    assert [round_robin(views, t) for t in range(4)] == ["a", "b", "a", "b"]
    down = [NodeView("x", up=False)]
    assert least_loaded(down) is None and round_robin(down, 0) is None


# ---------------------------------------------------------------------- asgi.run


async def _streaming_app(scope: Any, receive: Any, send: Any) -> None:
    """Echo the body, then stream parts until the client disconnects (what modeld's routes
    do: a disconnect cancels the request)."""
    body = (await receive())["body"]
    assert scope["path"] == "/x" and dict(scope["headers"])[b"host"] == b"127.0.0.1"
    assert b"authorization" not in dict(scope["headers"])
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    gone = asyncio.ensure_future(receive())
    while not gone.done():
        await send({"type": "http.response.body", "body": b".", "more_body": True})
        await asyncio.sleep(0.01)
    _streaming_app.disconnected = (await gone)["type"]  # type: ignore[attr-defined]


def test_asgi_run_streams_and_disconnects_when_closed_early() -> None:
    scope = {"method": "POST", "path": "/x", "headers": [(b"authorization", b"Bearer k"),
                                                          (b"content-type", b"text/plain")]}
    info = asgi.request_info(scope, b"hello")
    assert info["headers"] == [("content-type", "text/plain")]

    async def main() -> list[dict[str, Any]]:
        got = []
        stream = asgi.run(_streaming_app, info)
        async for message in stream:
            got.append(message)
            if len(got) == 4:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        return got

    got = asyncio.run(main())
    assert got[0] == {"type": "http.response.start", "status": 200, "headers": []}
    assert got[1]["body"] == b"hello" and got[2]["body"] == b"."
    assert _streaming_app.disconnected == "http.disconnect"  # type: ignore[attr-defined]


def test_asgi_run_ends_with_the_last_body_part() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def main() -> list[dict[str, Any]]:
        info = asgi.request_info({"method": "GET", "path": "/y", "headers": []}, b"")
        return [m async for m in asgi.run(app, info)]

    assert [m.get("status", m.get("body")) for m in asyncio.run(main())] == [404, b"{}"]


# ---------------------------------------------------------------------- the CLI, without Ray


def _modeld(*args: str, env: dict[str, str] | None = None) -> Any:
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    config = Path(tempfile.mkdtemp(prefix="mc-cfg-", dir="/tmp")) / "config.toml"
    config.touch()
    full = dict(os.environ, MODELD_CONFIG=str(config), **(env or {}))
    return subprocess.run([sys.executable, "-m", "modeld", *args], env=full, text=True,
                          capture_output=True, timeout=60)


def test_cluster_serve_refuses_a_public_address_without_a_key_before_ray() -> None:
    out = _modeld("cluster", "serve", "--http", "0.0.0.0:8123")
    assert out.returncode == 2
    assert "without an API key" in out.stderr and "MODELD_API_KEY" in out.stderr


def test_cluster_ps_with_no_ingress_says_how_to_start_one() -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = _modeld("cluster", "ps", "--http", f"127.0.0.1:{port}", "--json")
    assert out.returncode == 3, out.stderr
    assert '"kind": "error"' in out.stdout and "modeld cluster serve" in out.stderr
    bad = _modeld("cluster", "serve", "--policy", "random")
    assert bad.returncode == 2 and "unknown --policy 'random'" in bad.stderr


# ---------------------------------------------------------------------- the ingress's routing


class _Link:
    """An in-memory node: its daemon's plan for any model, and requests that finish when told
    (pure routing logic; the real links are tested in tests/test_cluster.py)."""

    def __init__(self, key: str, plan: str) -> None:
        self.key, self.plan = key, plan
        self.release = asyncio.Event()
        self.served: list[str] = []
        self.ids: list[str] = []  # the requests' ids, as the node got them
        self.cancelled: list[str] = []  # ids the ingress cancelled by name
        self.closed: list[str] = []  # ids whose stream was closed (its finally ran)

    async def probe(self, model: str | None) -> dict[str, Any]:
        return {"node": self.key, "plan": self.plan, "would_evict": [], "running": 0,
                "queued": 0}

    async def status(self) -> dict[str, Any]:
        return {"node": self.key, "models": []}

    async def http(self, info: dict[str, Any]) -> Any:
        import json

        self.served.append(json.loads(info["body"])["model"])
        self.ids.append(info["id"])
        try:
            yield {"type": "http.response.start", "status": 200,
                   "headers": [(b"content-type", b"application/json")]}
            await self.release.wait()
            yield {"type": "http.response.body", "body": b"{}"}
        finally:
            self.closed.append(info["id"])

    async def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


async def _request(ingress: Any, model: str, leave: asyncio.Event | None = None
                   ) -> list[dict[str, Any]]:
    """One request through ``ingress``; the client stays, or leaves when ``leave`` is set."""
    import json

    body = json.dumps({"model": model}).encode()
    sent: list[dict[str, Any]] = []
    parts = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if parts:
            return parts.pop()
        await (leave or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/generate", "headers": []}
    await ingress(scope, receive, send)
    return sent


def test_concurrent_first_requests_for_a_model_go_to_one_node() -> None:
    from modeld.cluster.ingress import Ingress

    async def main() -> tuple[_Link, _Link, list[Any]]:
        a, b = _Link("a", "admit"), _Link("b", "admit")
        ingress = Ingress([a, b])
        first = asyncio.ensure_future(_request(ingress, "m"))
        while not (a.served or b.served):  # the first is being served (its model loading)
            await asyncio.sleep(0)
        second = asyncio.ensure_future(_request(ingress, "m"))
        other = asyncio.ensure_future(_request(ingress, "n"))
        while len(a.served) + len(b.served) < 3:
            await asyncio.sleep(0)
        a.release.set()
        b.release.set()
        return a, b, await asyncio.gather(first, second, other)

    a, b, replies = asyncio.run(main())
    holder, other = (a, b) if "m" in a.served else (b, a)
    assert holder.served.count("m") == 2  # the second followed the first
    assert other.served == ["n"]  # a new model went to the node with nothing in flight
    served_by = [dict(sent[0]["headers"])[b"x-modeld-node"].decode() for sent in replies]
    assert served_by == [holder.key, holder.key, other.key]  # each reply names its node
    assert all(sent[0]["status"] == 200 and sent[-1]["body"] == b"{}" for sent in replies)


def test_round_robin_ignores_where_a_model_is() -> None:
    from modeld.cluster.ingress import Ingress

    async def main() -> tuple[_Link, _Link]:
        a, b = _Link("a", "loaded"), _Link("b", "evict")
        a.release.set()
        b.release.set()
        ingress = Ingress([a, b], policy="round-robin")
        for _ in range(4):
            await _request(ingress, "m")
        return a, b

    a, b = asyncio.run(main())
    assert a.served == ["m", "m"] and b.served == ["m", "m"]


def test_a_client_that_leaves_is_cancelled_on_its_node_by_name() -> None:
    from modeld.cluster.ingress import Ingress

    async def main() -> tuple[_Link, list[Any]]:
        a = _Link("a", "loaded")
        ingress = Ingress([a])
        leave = asyncio.Event()
        request = asyncio.ensure_future(_request(ingress, "m", leave))
        while not a.served:
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)  # the head was relayed; the node waits for its next part
        leave.set()
        sent = await request
        for _ in range(100):  # the cancel by name is sent beside the request's end
            if a.cancelled:
                break
            await asyncio.sleep(0.01)
        return a, sent

    a, sent = asyncio.run(main())
    assert [m["type"] for m in sent] == ["http.response.start"]  # nothing after the head
    assert a.cancelled == a.ids == a.closed  # the node's stream closed, and told by name
    assert len(a.ids[0]) == 32

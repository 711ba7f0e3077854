"""The cluster's HTTP front door: read ``model`` from the body, pick a daemon, relay the reply.

Every daemon is reached through a :class:`NodeLink` (in the cluster, a Ray Serve handle to the
deployment that runs beside it: :mod:`modeld.cluster.serve`). Per request the ingress asks each
node for its daemon's dry run for the model (``probe``), ranks them with
:func:`modeld.cluster.placement.choose` and runs the request on the winner, relaying its status,
headers and body parts as they come, so NDJSON and SSE streams stream. A node that does not
answer a probe in time is left out for :data:`DOWN_S` seconds; a node lost while it serves a
request costs that request only: it is answered with a ``daemon_unavailable`` error (503), or,
once streaming, with a last error event in the stream's own format.

Every reply names the node that served it (header ``x-modeld-node``).
Routes of its own: ``GET /cluster/ps`` (every node's ``ps``: ``modeld cluster ps``). Requests
without a ``model`` (``/api/tags``, ``/v1/models``, ...) go to the least loaded node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Protocol

from modeld.cluster import asgi, placement
from modeld.config import Settings
from modeld.errors import DaemonUnavailableError, InvalidRequestError, ModeldError
from modeld.settingvalues import is_loopback, parse_http_address

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Seconds a node may take to answer a probe before it counts as down.
PROBE_TIMEOUT_S = 5.0
#: Seconds a node that did not answer is left out before it is asked again.
DOWN_S = 10.0


class NodeLink(Protocol):
    """How the ingress reaches one node (see :class:`modeld.cluster.node.NodeAgent`)."""

    key: str  # stable id of the link (the deployment's name)

    async def probe(self, model: str | None) -> dict[str, Any]: ...

    async def status(self) -> dict[str, Any]: ...

    def http(self, info: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...

    async def cancel(self, request_id: str) -> None: ...


class Ingress:
    """The routing state: the links, requests in flight per node and model, nodes down."""

    def __init__(self, links: Sequence[NodeLink], policy: str = "placement",
                 max_body: int = 64 * 1024 * 1024) -> None:
        if policy not in ("placement", "round-robin"):
            raise InvalidRequestError(f"unknown routing policy {policy!r}",
                                      hint="use placement or round-robin")
        self.links = {link.key: link for link in links}
        self.policy = policy
        self.max_body = max_body
        self.sent: Counter[str] = Counter()  # link -> requests in flight
        self.sent_for: Counter[tuple[str, str]] = Counter()  # (link, model) -> in flight
        self.down_until: dict[str, float] = {}
        self.names: dict[str, str] = {}  # link -> node name its daemon reported
        self.turn = 0
        self.routed: Counter[str] = Counter()  # link -> requests routed (for tests, /cluster/ps)
        self._cancels: set[asyncio.Task[None]] = set()  # explicit cancels on their way

    # ------------------------------------------------------------------ probing

    def _up(self, key: str) -> bool:
        return self.down_until.get(key, 0.0) <= time.monotonic()

    async def _probe(self, key: str, model: str | None) -> placement.NodeView:
        link = self.links[key]
        try:
            got = await asyncio.wait_for(link.probe(model), PROBE_TIMEOUT_S)
        except (TimeoutError, Exception):  # a lost replica, a dead daemon, ...
            self.down_until[key] = time.monotonic() + DOWN_S
            return placement.NodeView(key, up=False)
        self.names[key] = str(got.get("node") or key)
        return placement.NodeView(
            key, plan=got.get("plan"), would_evict=tuple(got.get("would_evict") or ()),
            running=int(got.get("running") or 0), queued=int(got.get("queued") or 0),
            sent=self.sent[key], sent_for_model=self.sent_for[key, model or ""],
            error=got.get("error"))

    async def views(self, model: str | None) -> list[placement.NodeView]:
        keys = [k for k in self.links if self._up(k)]
        got = await asyncio.gather(*(self._probe(k, model) for k in keys))
        return list(got)

    async def pick(self, model: str | None) -> str:
        """The link to run a request for ``model`` on (raises when no node is up)."""
        views = await self.views(model)
        if self.policy == "round-robin":
            chosen = placement.round_robin(views, self.turn)
            self.turn += 1
        else:
            choice = placement.choose(views) if model is not None else None
            chosen = choice.node if choice else placement.least_loaded(views)
        if chosen is None:
            raise DaemonUnavailableError(
                "no modeld node of the cluster answers",
                hint="check `modeld cluster ps` and each machine's daemon (modeld serve)")
        return chosen

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive,
                       send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            body = await self._body(receive)
        except ModeldError as exc:
            await _error(scope, send, exc)
            return
        if scope["method"] == "GET" and scope["path"] == "/cluster/ps":
            await _json(send, 200, await self.status())
            return
        model = _model_of(body)
        try:
            key = await self.pick(model)
        except ModeldError as exc:
            await _error(scope, send, exc)
            return
        await self._relay(key, model or "", asgi.request_info(scope, body), scope, receive, send)

    def _cancel_on(self, key: str, request_id: str) -> None:
        """Tell the node to stop ``request_id`` by name as well: Ray's cancel of a handle call
        is best effort (ray-project/ray#52533: a child request can run on), and a generation
        left running holds the model for minutes."""

        async def tell() -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.links[key].cancel(request_id), PROBE_TIMEOUT_S)

        task = asyncio.ensure_future(tell())
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _body(self, receive: Receive) -> bytes:
        data = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise DaemonUnavailableError("the client left")
            data += message.get("body", b"")
            if len(data) > self.max_body:
                raise InvalidRequestError(f"the request body is larger than {self.max_body} "
                                          "bytes", hint="send less, or raise max_message_bytes")
            if not message.get("more_body"):
                return bytes(data)

    async def _relay(self, key: str, model: str, info: dict[str, Any],
                     scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        """Run the request on ``key`` and pass its messages on; the client leaving cancels it
        there (the node's app then cancels at its daemon)."""
        self.sent[key] += 1
        self.sent_for[key, model] += 1
        self.routed[key] += 1
        started = False
        content_type = ""
        stream = self.links[key].http(info)

        async def forward() -> None:
            nonlocal started, content_type
            async for message in stream:
                if message["type"] == "http.response.start":
                    started = True
                    headers = list(message.get("headers") or [])
                    content_type = dict(headers).get(b"content-type", b"").decode("latin-1")
                    node = self.names.get(key, key).encode("latin-1", "replace")
                    message = {**message, "headers": [*headers, (b"x-modeld-node", node)]}
                await send(message)

        work = asyncio.ensure_future(forward())
        gone = asyncio.ensure_future(_until_disconnect(receive))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():  # the client left: the node's request stops (finally)
                return
            exc = work.exception()
            if exc is not None:
                cause = getattr(exc, "cause", None) or exc  # Ray wraps the node's exception
                why = cause.message if isinstance(cause, ModeldError) else type(cause).__name__
                lost = DaemonUnavailableError(
                    f"the node {self.names.get(key, key)} was lost while serving this request "
                    f"({why})", hint="send it again: the next request goes to a node that answers")
                self.down_until[key] = time.monotonic() + DOWN_S
                with contextlib.suppress(Exception):
                    if started:
                        await _stream_error(send, content_type, lost)
                    else:
                        await _error(scope, send, lost)
        finally:
            gone.cancel()
            if not work.done():
                # The client left, as a disconnect message or as this task cancelled (Serve's
                # proxy cancels the request): either way the node's request stops now, not when
                # its next message finds no one to send it to.
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
                self._cancel_on(key, info["id"])
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await stream.aclose()  # type: ignore[attr-defined]  # (left at a yield: now)
            self.sent[key] -= 1
            self.sent_for[key, model] -= 1
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    async def status(self) -> dict[str, Any]:
        """Every node's ``ps`` (``GET /cluster/ps``); a node that does not answer says so."""

        async def one(key: str) -> dict[str, Any]:
            try:
                got = await asyncio.wait_for(self.links[key].status(), PROBE_TIMEOUT_S)
                got.update(up=True)
                self.down_until.pop(key, None)  # it answers: route to it again at once
            except (TimeoutError, Exception) as exc:
                got = {"node": self.names.get(key, key), "up": False,
                       "error": f"no answer ({type(exc).__name__})", "models": []}
            got.update(deployment=key, in_flight=self.sent[key], routed=self.routed[key])
            return got

        nodes = await asyncio.gather(*(one(k) for k in self.links))
        return {"policy": self.policy, "nodes": list(nodes)}


def check_access(settings: Settings) -> tuple[str, int]:
    """The ingress's address; like the daemon it refuses a non-loopback one without a key."""
    address = parse_http_address(settings.http)
    if address is None:
        raise InvalidRequestError("the cluster ingress needs an address, not 'off'",
                                  hint="pass --http HOST:PORT")
    if not is_loopback(address[0]) and settings.api_key is None:
        raise InvalidRequestError(
            f"refusing to serve on {address[0]} without an API key",
            hint="set api_key (MODELD_API_KEY) or serve on 127.0.0.1")
    return address


def _model_of(body: bytes) -> str | None:
    """The body's ``model`` when it is a JSON object naming one (else the node's own
    validation answers the request)."""
    try:
        doc = json.loads(body) if body.strip() else None
    except (ValueError, UnicodeDecodeError):
        return None
    model = doc.get("model") if isinstance(doc, dict) else None
    return model if isinstance(model, str) and model else None


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _json(send: Send, status: int, doc: dict[str, Any],
                headers: dict[str, str] | None = None) -> None:
    data = json.dumps(doc).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
            *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items())]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": data})


async def _error(scope: MutableMapping[str, Any], send: Send, exc: ModeldError) -> None:
    """The error in the shape of the API the path belongs to (OpenAI's under /v1), as the
    daemon's own front door answers it."""
    from modeld.http import ollama, openai

    path = str(scope.get("path", ""))
    response = (openai.error if path.startswith("/v1/") or path == "/rerank"
                else ollama.error)(exc)

    async def no_receive() -> Message:
        return {"type": "http.disconnect"}

    await response(scope, no_receive, send)


async def _stream_error(send: Send, content_type: str, exc: ModeldError) -> None:
    """A last event saying why the stream ends early: an SSE ``error`` event or an NDJSON
    ``{"error": ...}`` line (Ollama's form)."""
    from modeld.http.common import message_of

    if "event-stream" in content_type:
        doc = {"error": {"message": message_of(exc), "type": "server_error",
                         "code": exc.code.value}}
        data = f"data: {json.dumps(doc)}\n\n".encode()
    else:
        data = (json.dumps({"error": message_of(exc)}) + "\n").encode()
    await send({"type": "http.response.body", "body": data, "more_body": True})
    await send({"type": "http.response.body", "body": b""})

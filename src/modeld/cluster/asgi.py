"""One HTTP request run through an ASGI app in-process, as a stream of plain messages.

The node side of the cluster runs modeld's own HTTP app (every Ollama/OpenAI/Anthropic route,
their validation and errors) against its daemon's socket; the ingress sends it the request as a
dict and gets back ``http.response.start`` and ``http.response.body`` messages, which cross
Ray's handle as picklable dicts. When the caller stops reading (the client left, the stream was
cancelled) the app's ``receive`` answers ``http.disconnect``, which modeld's disconnect watch
turns into a cancel at the daemon, as for a client of the daemon's own front door.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Message]],
                    Callable[[Message], Awaitable[None]]], Awaitable[None]]

#: Headers the ingress has already acted on (access) and that must not reach the node's app.
HOP_HEADERS = frozenset({"host", "origin", "authorization", "x-api-key", "content-length",
                         "connection", "transfer-encoding"})
#: Seconds a cancelled app gets to tell its daemon before its task is cancelled.
CANCEL_GRACE_S = 2.0


def request_info(scope: MutableMapping[str, Any], body: bytes) -> dict[str, Any]:
    """What the node needs of an HTTP request: picklable, access headers left out; ``id``
    names it for an explicit cancel (:meth:`modeld.cluster.node.NodeAgent.cancel`)."""
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])
               if k.decode("latin-1").lower() not in HOP_HEADERS]
    return {"id": uuid.uuid4().hex, "method": scope["method"], "path": scope["path"],
            "query_string": scope.get("query_string", b"").decode("latin-1"),
            "headers": headers, "body": body}


def _scope(info: dict[str, Any]) -> dict[str, Any]:
    body: bytes = info["body"]
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in info["headers"]]
    headers += [(b"host", b"127.0.0.1"), (b"content-length", str(len(body)).encode())]
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": info["method"], "scheme": "http", "path": info["path"],
            "raw_path": info["path"].encode(), "root_path": "",
            "query_string": info["query_string"].encode("latin-1"), "headers": headers,
            "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}


async def run(app: ASGIApp, info: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """Run ``app`` for one request and yield its messages (start, then body parts) as they
    come. Closing the iterator early disconnects the request."""
    out: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    gone = asyncio.Event()
    sent_body = False

    async def receive() -> Message:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": info["body"], "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if gone.is_set():
            raise OSError("the client went away")
        if message["type"] in ("http.response.start", "http.response.body"):
            await out.put({k: v for k, v in message.items() if k != "trailers"})

    async def serve() -> None:
        try:
            await app(_scope(info), receive, send)
        finally:
            await out.put(None)

    task = asyncio.ensure_future(serve())
    try:
        while (message := await out.get()) is not None:
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body"):
                break
        await task
    finally:
        if not task.done():
            gone.set()
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), CANCEL_GRACE_S)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

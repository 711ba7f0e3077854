"""Ollama's ``POST /api/pull`` and ``DELETE /api/delete`` on modeld: models from Hugging Face
(``hf.co/ORG/REPO:QUANT``), pulled by :mod:`modeld.pull.puller` in a worker thread.

Progress is Ollama's NDJSON: ``pulling manifest``, ``pulling <digest>`` lines with ``digest``,
``total`` and ``completed`` (one file per split-model shard), ``verifying sha256 digest``,
``writing manifest``, ``success``; an error before the first line is an HTTP status, after it
an ``{"error": …}`` line. Only names on the configured hub (``HF_ENDPOINT``) are fetched: no URL
from the request is ever requested as given (Ollama's pull had an SSRF, CVE-2026-5530). A
client that disconnects cancels its pull; the partial file stays for the next pull to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from modeld.errors import InvalidRequestError, ModeldError
from modeld.http.common import API, message_of, model_name, read_json, status_of
from modeld.http.reply import committed, ndjson, stream_or_error

_END = object()
log = logging.getLogger("modeld.http")


class Pulls:
    """The pulls running in this process, each in a thread of its own: a daemon thread, so
    a hub that stalls never holds the process's exit; :meth:`stop` cancels them all and gives
    them a moment to remove their lock files (the partial downloads stay, to resume)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[threading.Thread, threading.Event] = {}

    def start(self, work: Callable[[], None], cancel: threading.Event) -> None:
        def run() -> None:
            try:
                work()
            finally:
                with self._lock:
                    self._running.pop(thread, None)

        thread = threading.Thread(target=run, name="pull", daemon=True)
        with self._lock:
            self._running[thread] = cancel
        thread.start()

    def stop(self, timeout_s: float) -> None:
        with self._lock:
            running = dict(self._running)
        for cancel in running.values():
            cancel.set()
        deadline = time.monotonic() + timeout_s
        for thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))


#: This process's pulls (the front door stops them when the daemon stops).
ACTIVE = Pulls()


def error(exc: ModeldError) -> JSONResponse:
    return JSONResponse({"error": message_of(exc)}, status_code=status_of(exc))


def ollama_lines(event: dict[str, Any]) -> list[dict[str, Any]]:
    """One puller event → the Ollama progress lines it means (maybe none)."""
    kind = event["event"]
    if kind == "chosen":
        return [{"status": "pulling manifest"}] + [
            {"status": f"pulling {_short(f['digest'])}", "digest": f["digest"],
             "total": f["size"], "completed": 0} for f in event["files"]]  # fmt: skip
    if kind == "progress" and event["phase"] in ("downloading", "waiting", "resuming"):
        return [{"status": f"pulling {_short(event['digest'])}", "digest": event["digest"],
                 "total": event["total"], "completed": event["completed"]}]  # fmt: skip
    if kind == "file_done":
        return [{"status": f"pulling {_short(event['digest'])}", "digest": event["digest"],
                 "total": event["size"], "completed": event["size"]}]  # fmt: skip
    if kind == "success":
        return [{"status": "verifying sha256 digest"}, {"status": "writing manifest"},
                {"status": "success"}]  # fmt: skip
    return []


def _short(digest: str) -> str:
    return digest.split(":", 1)[-1][:12]


class PullAPI(API):
    def routes(self) -> list[Route]:
        return [Route("/api/pull", self.pull, methods=["POST"]),
                Route("/api/delete", self.delete, methods=["DELETE"])]  # fmt: skip

    async def pull(self, request: Request) -> Response:
        try:
            doc = await read_json(request, self.limit)
            name = doc.get("model") or doc.get("name")
            if not isinstance(name, str) or not name.strip():
                raise InvalidRequestError("'model' must name a model",
                                          hint="e.g. hf.co/ORG/REPO:Q4_K_M")  # fmt: skip
            from modeld.pull.puller import parse_ref

            parse_ref(name)  # a bad name is a 400 before anything starts
        except ModeldError as exc:
            return error(exc)
        lines = self._run(name.strip())
        if doc.get("stream") is False:
            last: dict[str, Any] = {}
            try:
                async for line in lines:
                    last = line
            except ModeldError as exc:
                return error(exc)
            return JSONResponse(last)

        async def body() -> AsyncIterator[list[bytes]]:
            async for line in lines:
                yield [ndjson(line)]

        parts = committed(body(), lambda exc: [ndjson({"error": message_of(exc)})])
        return await stream_or_error(parts, "application/x-ndjson", error)

    async def _run(self, name: str) -> AsyncIterator[dict[str, Any]]:
        """The pull in a worker thread, its events as Ollama lines; leaving early cancels it."""
        from modeld.pull.puller import pull

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()
        models_dir = Path(self.settings.models_dir).expanduser()

        def emit(event: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the daemon stops
                loop.call_soon_threadsafe(queue.put_nowait, event)

        def work() -> None:
            try:
                pull(name, models_dir, emit, cancel, self.settings.partial_max_age_s)
                emit(_END)
            except ModeldError as exc:  # handed to the request's task, raised there
                emit(exc)
            except Exception as exc:
                log.error("the pull of %s failed", name, exc_info=exc)
                emit(ModeldError(f"the pull failed: {type(exc).__name__}: {exc}",
                                 hint="see the daemon log"))

        ACTIVE.start(work, cancel)
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                for line in ollama_lines(item):
                    yield line
        finally:
            cancel.set()  # no-op when finished; else the client left: stop at the next chunk

    async def delete(self, request: Request) -> Response:
        try:
            doc = await read_json(request, self.limit)
            name = doc.get("model") or doc.get("name")
            if not isinstance(name, str) or not name.strip():
                raise InvalidRequestError("'model' must name a model", hint="GET /api/tags")
            from modeld import registry
            from modeld.pull import store

            ref = name.strip()
            if not self.settings.http_model_paths:  # a name, never a path: as every route
                ref = model_name(ref, self.settings)
            path = await asyncio.to_thread(registry.removable, ref, self.settings)
            rows = (await self.bridge.call("ps")).get("models", [])
            if any(r.get("path") == str(path) for r in rows):
                await self.bridge.call("unload", model=str(path))  # as `modeld rm --force`
            models_dir = Path(self.settings.models_dir).expanduser()
            await asyncio.to_thread(store.remove, path, models_dir)
        except ModeldError as exc:
            return error(exc)
        return Response(status_code=200)

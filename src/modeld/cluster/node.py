"""What runs beside each daemon in a cluster: answers the ingress's questions about its daemon
and runs its HTTP requests, all over the daemon's ZeroMQ socket.

- :meth:`NodeAgent.probe`: the daemon's own dry run (``show``) for a model, which says whether
  the model is loaded or loading there and what loading it would evict, with the requests
  running and queued (``ps``). Asked per request, so routing follows the daemon's real loaded
  set: an eviction or a keep-alive expiry is seen on the next request.
- :meth:`NodeAgent.status`: the daemon's ``ps`` for ``modeld cluster ps``.
- :meth:`NodeAgent.http`: one request run through modeld's HTTP app in-process, bridged to the
  daemon's socket (:mod:`modeld.cluster.asgi`); a daemon that stops answering meanwhile ends it
  with :class:`DaemonUnavailableError` (the ingress turns that into the request's error).

No Ray here: :mod:`modeld.cluster.serve` wraps it in a Serve deployment.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from modeld.client import Client
from modeld.cluster import asgi
from modeld.config import Settings, load_settings
from modeld.errors import DaemonUnavailableError, ModeldError, RequestTimeoutError

#: Seconds a probe may wait for the daemon (a busy daemon still answers show/ps at once).
PROBE_TIMEOUT_S = 10.0
#: While requests run, the daemon is pinged this often; one that stops answering (killed) ends
#: them with an error instead of leaving them waiting on its socket.
WATCH_S = 2.0


def node_name(node_id: str = "") -> str:
    """``MODELD_NODE_NAME``, else the host name (with a short Ray node id when given: simulated
    nodes on one machine share a host name)."""
    name = os.environ.get("MODELD_NODE_NAME")
    if name:
        return name
    host = socket.gethostname()
    return f"{host}-{node_id[:6]}" if node_id else host


class NodeAgent:
    """One machine's daemon, as the cluster sees it."""

    def __init__(self, settings: Settings, name: str, *, autostart: bool = True) -> None:
        from modeld.http.app import build
        from modeld.http.bridge import Bridge

        self.settings = settings
        self.name = name
        self._lock = threading.Lock()
        self._client = self._new_client()
        self._watch_client = self._new_client()
        self._watch_lock = threading.Lock()
        self._lost: asyncio.Event | None = None
        self._watch: asyncio.Task[None] | None = None
        self._running = 0
        #: requests running, by id: set to stop one (:meth:`cancel`); ids cancelled before
        #: their request arrived (two Ray calls need not arrive in order), oldest first
        self._stops: dict[str, asyncio.Event] = {}
        self._early: dict[str, None] = {}
        try:
            self._client.ping()
        except DaemonUnavailableError:
            if not autostart or os.environ.get("MODELD_NO_AUTOSTART") in ("1", "true", "yes"):
                raise
            self._start_daemon()
        # the node's HTTP app: the ingress has applied the access rules, so this one is
        # loopback-only and keyless (it is reached only in-process, never over a socket)
        local = dataclasses.replace(settings, http="127.0.0.1:11434", api_key=None, http_origins=())
        self._app = build(local, Bridge(settings.socket))

    def _start_daemon(self, timeout: float = 60.0) -> None:
        """Start this machine's daemon in the background (``modeld serve``, its own session,
        output to ``<log_dir>/daemon-cluster.log``) and wait until it answers."""
        log_dir = self.settings.log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / "daemon-cluster.log", "ab") as out:
            subprocess.Popen([sys.executable, "-m", "modeld", "serve"], stdin=subprocess.DEVNULL,
                             stdout=out, stderr=out, start_new_session=True, close_fds=True,
                             env=dict(os.environ, MODELD_SOCKET=self.settings.socket))
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._client.ping()
                return
            except DaemonUnavailableError:
                self._client = self._fresh(self._client)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _new_client(self) -> Client:
        from modeld.client import Client

        return Client(self.settings.socket, timeout=PROBE_TIMEOUT_S, connect_timeout=2.0)

    def _fresh(self, client: Client) -> Client:
        """A new client in place of one whose daemon stopped answering (a daemon started again
        on the same socket is then reached on a new connection)."""
        client.close()
        return self._new_client()

    @classmethod
    def from_environment(cls, node_id: str = "") -> NodeAgent:
        settings, _ = load_settings()
        return cls(settings, node_name(node_id))

    def _ask(self, model: str | None) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {"node": self.name, "plan": None, "would_evict": []}
            try:
                shown = self._client.show(model)
                out.update(plan=shown.get("plan"), would_evict=shown.get("would_evict") or [],
                           model=shown.get("name"))
                if shown.get("error"):
                    out.update(plan=None, error=shown["error"].get("message"))
                elif not shown.get("fits", True):
                    out["plan"] = "refuse"
            except (DaemonUnavailableError, RequestTimeoutError):
                self._client = self._fresh(self._client)
                raise
            except ModeldError as exc:  # the daemon does not know the name, ...
                out["error"] = exc.message
            rows = self._client.ps()
        out["running"] = sum(int(r.get("in_flight") or 0) for r in rows)
        out["queued"] = sum(int(r.get("queued") or 0) for r in rows)
        return out

    async def probe(self, model: str | None) -> dict[str, Any]:
        """The daemon's plan for ``model`` and its request counts (see the module doc)."""
        return await asyncio.to_thread(self._ask, model)

    def _status(self) -> dict[str, Any]:
        with self._lock:
            try:
                reply = self._client.ps_reply()
            except (DaemonUnavailableError, RequestTimeoutError):
                self._client = self._fresh(self._client)
                raise
        return {"node": self.name, "socket": self.settings.socket,
                "models": reply.get("models", []), "budget_bytes": reply.get("budget_bytes"),
                "used_bytes": reply.get("used_bytes"), "max_models": reply.get("max_models")}

    async def status(self) -> dict[str, Any]:
        """The daemon's ``ps`` with its budget, labelled with this node's name."""
        return await asyncio.to_thread(self._status)

    def ping(self) -> None:
        """Raises :class:`DaemonUnavailableError` when the daemon does not answer."""
        with self._lock:
            try:
                self._client.ping()
            except (DaemonUnavailableError, RequestTimeoutError):
                self._client = self._fresh(self._client)
                raise

    def _ping_watch(self) -> None:
        with self._watch_lock:
            try:
                self._watch_client.ping()
            except (DaemonUnavailableError, RequestTimeoutError):
                self._watch_client = self._fresh(self._watch_client)
                raise

    async def _watchdog(self, lost: asyncio.Event) -> None:
        """Ping the daemon while requests run; set ``lost`` when it stops answering."""
        while self._running:
            await asyncio.sleep(WATCH_S)
            try:
                await asyncio.to_thread(self._ping_watch)
            except ModeldError:
                lost.set()
                return

    async def http(self, info: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Run one HTTP request (``asgi.request_info``) against the daemon; its messages."""
        if self._lost is None or self._lost.is_set():
            self._lost = asyncio.Event()
        lost = self._lost
        self._running += 1
        if self._watch is None or self._watch.done():
            self._watch = asyncio.ensure_future(self._watchdog(lost))
        stream = asgi.run(self._app, info)
        rid = str(info.get("id") or "")
        stop = self._stops[rid] = asyncio.Event()
        if rid in self._early:
            del self._early[rid]
            stop.set()
        gone = asyncio.ensure_future(lost.wait())
        stopped = asyncio.ensure_future(stop.wait())
        step: asyncio.Future[dict[str, Any]] | None = None
        try:
            while not stop.is_set():
                step = asyncio.ensure_future(anext(stream))
                await asyncio.wait({step, gone, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if gone.done() and not step.done():
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await step  # the stream must be idle before it is closed
                    raise DaemonUnavailableError(
                        f"the daemon of {self.name} stopped answering",
                        hint="the request was lost with it; send it again")
                if not step.done():
                    break  # cancelled by name: the finally closes the stream
                try:
                    message = step.result()
                except StopAsyncIteration:
                    return
                yield message
        finally:
            self._running -= 1
            self._stops.pop(rid, None)
            gone.cancel()
            stopped.cancel()
            if step is not None and not step.done():
                # Cancelled (the client left) while the stream waits for its next message:
                # a running generator cannot be closed, and left to the garbage collector its
                # cleanup (the disconnect that cancels at the daemon) came seconds late.
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await step
            await stream.aclose()  # type: ignore[attr-defined]

    async def cancel(self, request_id: str) -> None:
        """Stop the request ``request_id`` (from :meth:`http`'s ``info``): its stream closes,
        which disconnects it at the daemon. One not seen yet is stopped when it arrives."""
        stop = self._stops.get(request_id)
        if stop is not None:
            stop.set()
            return
        self._early[request_id] = None
        while len(self._early) > 1024:  # ids whose request never came: forget the oldest
            del self._early[next(iter(self._early))]

    def close(self) -> None:
        self._client.close()
        self._watch_client.close()

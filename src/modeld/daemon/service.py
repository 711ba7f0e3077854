"""The daemon's request service: its client socket, the runners' socket and the scheduler.

One event loop (:meth:`Service.loop`): a zmq.Poller waits on the client ROUTER and the runner
ROUTER with a short timeout that doubles as the timer (dead runners, keep-alive, waits).
Client requests are decoded, answered at once (ps, stats, show, cancel, unload) or turned into
scheduler jobs; runner messages go to the scheduler. The process around it (lock file, signals,
socket setup, logging) is :mod:`modeld.daemon.server`.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from modeld import __version__
from modeld.cache.policy import CachePolicy, ModelKey
from modeld.config import Settings
from modeld.daemon import grammarproc, growth, views
from modeld.daemon.builds import Build, Builds
from modeld.daemon.jobs import (
    Job,
    keep_alive_of,
    needs_grammar,
    request_grammar,
    request_job,
    requested_ctx,
)
from modeld.daemon.scheduler import Scheduler
from modeld.daemon.supervisor import Supervisor
from modeld.errors import (
    InvalidRequestError,
    ModeldError,
    ModelNotFoundError,
    ShuttingDownError,
)
from modeld.model import memory
from modeld.wire import protocol, replyflow, reqparse
from modeld.wire.replies import Validation

log = logging.getLogger("modeld.daemon")

TICK_S = 0.1  # timer resolution: dead runners are noticed within this (well under 2 s)
#: How often clients with requests are probed for having vanished (issue 21: a SIGKILLed CLI
#: was noticed only at its first token, 21 s into a long prompt).
PROBE_S = 0.25
PROBE = protocol.Message("probe", "modeld-probe")
_DRAIN = 256  # messages handled per socket per loop turn, so timers keep running under load
JobRequest = (reqparse.GenerateRequest | reqparse.EmbedRequest | reqparse.RerankRequest
              | reqparse.LoadRequest)  # fmt: skip


class Service:
    """Everything a running daemon serves with; made once its sockets are bound."""

    def __init__(
        self,
        settings: Settings,
        endpoint: str,
        sock: zmq.Socket[Any],
        supervisor: Supervisor,
        cache: CachePolicy,
        usable_bytes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.endpoint = endpoint
        self.sock = sock
        self.sup = supervisor
        self.usable_bytes = usable_bytes
        self._clock = clock  # the one clock of the cache, the supervisor and the scheduler
        self.started = clock()
        self.stop_requested = False
        self.http_address: str | None = None  # where the front door listens ("host:port")
        self.sched = Scheduler(settings, cache, supervisor, self._send_job, clock)
        self.builds = Builds()  # grammars, built off the loop

    def loop(self) -> None:
        """Serve until :attr:`stop_requested` (a signal, a ``shutdown`` request)."""
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.sup.socket, zmq.POLLIN)
        poller.register(self.builds.wake_fd, zmq.POLLIN)
        next_tick = next_probe = 0.0
        while not self.stop_requested:
            try:
                events = dict(poller.poll(int(TICK_S * 1000)))
            except zmq.ZMQError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if self.sup.socket in events:
                for _ in range(_DRAIN):
                    if not self.sup.socket.poll(0, zmq.POLLIN):
                        break
                    got = self.sup.receive()
                    if got is not None:
                        self._guard(self.sched.on_runner_message, *got)
            if self.sock in events:
                for _ in range(_DRAIN):
                    if not self.sock.poll(0, zmq.POLLIN) or self.stop_requested:
                        break
                    self._guard(self._on_client, self.sock.recv_multipart())
            if self.builds.wake_fd in events:
                self._guard(self.builds.drain)
            now = self._clock()
            if now >= next_tick:
                next_tick = now + TICK_S
                self._guard(self.sched.tick)
            if now >= next_probe:
                next_probe = now + PROBE_S
                self._guard(self._probe_clients)

    def close(self) -> None:
        """Answer every open request (pending grammar builds too) with ``shutting_down``."""
        self.builds.close(ShuttingDownError("the daemon is shutting down",
                                            hint="start it again with modeld serve"))
        grammarproc.stop_all()
        self.sched.shutdown()

    def _guard(self, fn: Any, *args: Any) -> None:
        """Run one handler; a bug in it is logged, never fatal to the daemon."""
        try:
            fn(*args)
        except Exception:
            log.exception("internal error in %s", getattr(fn, "__name__", fn))

    # ------------------------------------------------------------------ client I/O

    def _send(self, client: bytes, msg: protocol.Message) -> bool:
        """Send to a client; False when it is gone (ROUTER_MANDATORY) or not keeping up."""
        try:
            self.sock.send_multipart([client, *protocol.encode(msg)], flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            if exc.errno not in (errno.EHOSTUNREACH, errno.EAGAIN):
                log.warning("send to client failed: %s", exc)
            return False
        except ModeldError as exc:  # unencodable (e.g. NaN in embeddings)
            log.warning("cannot encode reply %s: %s", msg.id, exc)
            return self._send(client, protocol.error_reply(msg.id, exc))
        return True

    def _probe_clients(self) -> None:
        """Find clients that vanished while nothing was sent to them (a prompt still being
        evaluated, a queued request, a load): ROUTER_MANDATORY refuses a send to a peer whose
        connection is gone (a SIGKILLed CLI), so each client with requests gets a ``probe``
        message, which clients skip (its id is no request's), and a refused one is cancelled
        like any vanished client."""
        for client in views.clients_waiting(self.sched) | self.builds.clients():
            if not self._send(client, PROBE):
                log.info("a client with requests in flight went away; cancelling them")
                self.sched.client_gone(client)
                self.builds.cancel(client)  # a grammar building for it stops too

    def _send_job(self, job: Job, msg: protocol.Message) -> bool:
        """Send a job's reply; a reply held to a schema keeps its text, and its ``done``
        goes once the complete reply is validated (:mod:`modeld.daemon.replycheck`)."""
        check = job.check
        if check is not None and msg.type == "chunk":
            check.add(str(msg.body.get("text", "")))
        elif check is not None and msg.type == "done":
            client = job.client

            def then(result: Validation) -> None:
                self._send(client, protocol.done(msg.id, **msg.body, validation=result))

            def fail(exc: ModeldError) -> None:  # cancelled, or the daemon is stopping
                self._send(client, protocol.error_reply(msg.id, exc))

            self.builds.start(Build(client, msg.id, then, fail), lambda: check.result(msg.body),
                              big=check.size() >= grammarproc.CHILD_FROM)
            return True
        return self._send(job.client, msg)

    def _on_client(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            log.warning("dropping a message without an identity or body")
            return
        client = frames[0]
        try:
            msg = protocol.decode(frames[1:])
        except (protocol.ProtocolError, protocol.VersionMismatchError) as exc:
            log.warning("bad message from client: %s", exc)
            self._send(client, protocol.error_reply(exc.request_id or "", exc))
            return
        if self.sched.stopping:
            self._send(
                client,
                protocol.error_reply(msg.id, ShuttingDownError("the daemon is shutting down")),
            )
            return
        try:
            self._handle(client, msg)
        except ModeldError as exc:
            self._send(client, protocol.error_reply(msg.id, exc))

    def _handle(self, client: bytes, msg: protocol.Message) -> None:
        req = reqparse.parse_request(msg)
        t = msg.type
        reply = self._send
        if t in ("ping", "version"):
            reply(
                client,
                protocol.done(
                    msg.id,
                    pong=True,
                    version=__version__,
                    protocol=replyflow.PROTOCOL_VERSION,
                    pid=os.getpid(),
                    endpoint=self.endpoint,
                ),
            )
        elif t == "ps":
            reply(client, protocol.done(msg.id, **views.ps(self.sched)))
        elif t == "stats":
            reply(client, protocol.done(msg.id, **self._stats()))
        elif t == "shutdown":
            reply(client, protocol.done(msg.id, stopping=True))
            self.stop_requested = True
        elif isinstance(req, reqparse.CancelRequest):
            found = self.sched.cancel(client, req.target) or self.builds.cancel(client, req.target)
            reply(client, protocol.done(msg.id, cancelled=found))
        elif isinstance(req, reqparse.UnloadRequest):
            self._unload(client, msg.id, req)
        elif isinstance(req, reqparse.ShowRequest):
            reply(client, protocol.done(msg.id, **self._show(req)))
        elif isinstance(
            req,
            reqparse.GenerateRequest
            | reqparse.EmbedRequest
            | reqparse.RerankRequest
            | reqparse.LoadRequest,
        ):
            self._submit(client, msg.id, req)
        else:  # pragma: no cover - parse_request covers every type
            raise InvalidRequestError(f"unhandled request type {t!r}")

    def _key(self, ref: str | None, mode: str) -> tuple[ModelKey, str]:
        from modeld import registry

        resolved = registry.resolve(ref, self.settings)
        try:
            key = ModelKey.for_file(resolved.path, memory.mode_of(mode))
        except OSError as exc:
            raise ModelNotFoundError(
                f"cannot open {resolved.path}: {exc.strerror}", hint="check the path"
            ) from exc
        return key, resolved.name

    def _mode_or_natural(self, ref: str | None, mode: str | None) -> str:
        """``mode``, or when a load or show names none, the one the model is made for: rerank
        for a reranker, else generate."""
        if mode is not None:
            return mode
        key, _ = self._key(ref, "generate")
        try:
            info = self.sched.model_info(key)
        except ModeldError:  # unreadable: the load itself fails and says why (a counted request)
            return "generate"
        return info.natural_mode

    def _submit(self, client: bytes, rid: str, req: JobRequest) -> None:
        """Hand the request to the scheduler; one whose reply follows a grammar first has the
        grammar built on a thread (the loop goes on serving meanwhile)."""
        if not (isinstance(req, reqparse.GenerateRequest) and needs_grammar(req)):
            self.sched.submit(self._job(client, rid, req))
            return
        key, _ = self._key(req.model, req.mode)  # an unknown model: its error now

        def fail(exc: ModeldError) -> None:
            self._send(client, protocol.error_reply(rid, exc))

        def then(gbnf: str | None) -> None:
            if self.sched.stopping:
                return fail(ShuttingDownError("the daemon is shutting down"))
            try:
                self.sched.submit(self._job(client, rid, req, gbnf))
            except ModeldError as exc:
                fail(exc)

        build: Build[str | None] = Build(client, rid, then, fail)
        self.builds.start(build, lambda: request_grammar(req, key, self.settings, build.token),
                          big=grammarproc.big(req.format, req.tools))

    def _job(self, client: bytes, rid: str, req: JobRequest, gbnf: str | None = None) -> Job:
        """``req``'s job (``gbnf``: a generate request's grammar, built already)."""
        if not isinstance(req, reqparse.LoadRequest):
            key, name = self._key(req.model, req.mode)
            if isinstance(req, reqparse.GenerateRequest) and req.has_images:
                self._check_vision(key, name)
            if isinstance(req, reqparse.GenerateRequest) and len(req.prompt or "") + sum(
                    len(m.content) for m in req.messages or ()) >= growth.FROM_BYTES:
                self._check_size(req, key, name)
            job = request_job(client, rid, req, key, name, self.settings, gbnf)
            job.rpc = self.settings.rpc.get(name)  # a model whose workers the config names
            return job
        key, name = self._key(req.model, self._mode_or_natural(req.model, req.mode))
        self.sched.forget_failure(key)  # asked for explicitly: try again now
        keep_alive = keep_alive_of(req.keep_alive, self.settings)
        return Job(client=client, rid=rid, kind="load", key=key, name=name,
                   keep_alive_s=keep_alive, n_ctx=requested_ctx(req.n_ctx), pinned=req.pinned,
                   parallel=req.parallel, kv_unified=req.kv_unified,
                   kv_cache_type=req.kv_cache_type,
                   gpu_layers=req.gpu_layers, mmproj=req.mmproj,
                   rpc=req.rpc if req.rpc is not None else self.settings.rpc.get(name))  # fmt: skip

    def _check_size(self, req: reqparse.GenerateRequest, key: ModelKey, name: str) -> None:
        """A prompt its bytes prove too long for the model is refused now, not queued."""
        try:
            info = self.sched.model_info(key)
        except ModeldError:  # unreadable: its load fails and says why
            return
        if (err := growth.too_long(req, info, name)) is not None:
            self.sched.cache.record_request()  # a request seen, and answered: counted
            raise err

    def _check_vision(self, key: ModelKey, name: str) -> None:
        """A request with images for a model without an image projector fails here, by name."""
        if self.sched.admission.projector(key, name) is None:
            raise InvalidRequestError(
                f"model {name!r} cannot see images: it has no image projector (mmproj)",
                hint="put the model's mmproj .gguf beside it, name one in the config's "
                "[mmproj] table or load the model with --mmproj; or send text only",
                details={"model": name})  # fmt: skip

    def _unload(self, client: bytes, rid: str, req: reqparse.UnloadRequest) -> None:
        keys = list(views.loaded(self.sched)) if req.all else self._loaded_keys(req.model, req.mode)
        now, later = self.sched.unload(keys)
        self._send(client, protocol.done(rid, unloaded=now, unloading_when_idle=later))

    def _loaded_keys(self, ref: str | None, mode: str | None) -> list[ModelKey]:
        """The loaded entries ``ref`` names: every name a model is requested or shown under
        (``default``, a path, an alias, a models-dir name, and the name ``ps`` shows, which
        for the default model is its file's stem: no registry lookup finds that one)."""
        from modeld import registry

        ref = None if ref in (None, "", "default") else ref
        path: str | None = None
        try:
            path = ModelKey.for_file(registry.resolve(ref, self.settings).path).path
        except ModelNotFoundError:
            if ref is None:
                raise
        except OSError:  # gone since: the names ps shows still find it
            pass
        loaded = views.loaded(self.sched)
        keys = [
            k for k, name in loaded.items()
            if (k.path == path or name == ref or registry.model_stem(Path(k.path)) == ref)
            and (mode is None or k.mode == mode)
        ]  # fmt: skip
        if not keys:
            shown = sorted(set(loaded.values()))
            raise ModelNotFoundError(
                f"{ref or 'default'} is not loaded",
                hint=("loaded: " + ", ".join(shown)) if shown else "no model is loaded",
            )
        return keys

    def _show(self, req: reqparse.ShowRequest) -> dict[str, Any]:
        key, name = self._key(req.model, self._mode_or_natural(req.model, req.mode))
        return views.show(self.sched, key, name, req.n_ctx)

    def _stats(self) -> dict[str, Any]:
        stats = views.stats(self.sched)
        stats.update(
            uptime_s=self._clock() - self.started,
            pid=os.getpid(),
            endpoint=self.endpoint,
            http_address=self.http_address,
            version=__version__,
            usable_bytes=self.usable_bytes,
            memory_fraction=self.settings.memory_fraction,
            memory_cap_bytes=self.settings.memory_cap_bytes,
            runners=len(self.sup.runners),
            runner_stalls=self.sup.stalls,
        )
        return stats

"""The modeld daemon: one event loop that owns all state, sockets, lock file and signals.

A zmq.Poller waits on the client ROUTER and the runner ROUTER with a short timeout that doubles
as the timer (dead runners, keep-alive, waits). Loads run in runner processes and report back as
messages, so the loop never blocks on a model. Request scheduling lives in
:mod:`modeld.daemon.scheduler`, runner processes in :mod:`modeld.daemon.supervisor`.

``modeld serve`` calls :func:`serve`; tests use ``python -m modeld.daemon --socket EP ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import zmq

from modeld import __version__, memory, paths, protocol
from modeld.cache.policy import CachePolicy, ModelKey
from modeld.config import Settings, load_settings
from modeld.daemon import sizing
from modeld.daemon.jobs import Job, keep_alive_of, request_job, requested_ctx
from modeld.daemon.scheduler import Scheduler
from modeld.daemon.supervisor import Supervisor
from modeld.errors import (
    InvalidRequestError,
    ModeldError,
    ModelNotFoundError,
    ShuttingDownError,
    format_bytes,
    unusable_path,
)

log = logging.getLogger("modeld.daemon")

TICK_S = 0.1  # timer resolution: dead runners are noticed within this (well under 2 s)
_DRAIN = 256  # messages handled per socket per loop turn, so timers keep running under load


class DaemonRunningError(ModeldError):
    """Another daemon holds the lock for this socket."""


class Daemon:
    """See the module docstring. Create, then :meth:`run` (returns the exit status)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.endpoint = settings.socket or paths.socket_endpoint()
        self.started = time.monotonic()
        self.stop_requested = False
        self._lock_fd: int | None = None
        self.budget_bytes, self.usable_bytes = sizing.memory_budget(settings)

    # ------------------------------------------------------------------ lifecycle

    def _lock(self) -> None:
        """Take the flock that keeps a second daemon off this socket; clean a stale socket."""
        lock_path = paths.lock_file(self.endpoint)
        try:
            paths.ensure_private_dir(lock_path.parent)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise unusable_path(exc, "socket") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            other = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DaemonRunningError(
                f"another modeld daemon (pid {other}) is already serving {self.endpoint}",
                hint="stop it first (`modeld stop`), or use another --socket",
            ) from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        sock_path = paths.ipc_path(self.endpoint)
        if sock_path is not None:
            paths.ensure_private_dir(sock_path.parent)
            if sock_path.exists() or sock_path.is_symlink():
                log.info("removing stale socket %s", sock_path)
                sock_path.unlink()

    def _unlock(self) -> None:
        sock_path = paths.ipc_path(self.endpoint)
        if sock_path is not None:
            with contextlib.suppress(FileNotFoundError):
                sock_path.unlink()
        if self._lock_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                paths.lock_file(self.endpoint).unlink()
            os.close(self._lock_fd)
            self._lock_fd = None

    def run(self) -> int:
        self._lock()
        try:
            return self._run_locked()
        finally:
            self._unlock()

    def _run_locked(self) -> int:
        ctx: zmq.Context[Any] = zmq.Context()
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.MAXMSGSIZE, int(self.settings.max_message_bytes))
        self.sock.setsockopt(zmq.SNDHWM, 100_000)
        self.sock.setsockopt(zmq.RCVHWM, 100_000)
        try:
            self.sock.bind(self.endpoint)
        except zmq.ZMQError as exc:  # address in use, a path too long for a unix socket, ...
            raise InvalidRequestError(
                f"cannot serve on {self.endpoint}: {exc.strerror}",
                hint="use another --socket / MODELD_SOCKET (an ipc path must stay under "
                "~100 bytes)",
                details={"endpoint": self.endpoint},
            ) from None
        sock_path = paths.ipc_path(self.endpoint)
        if sock_path is not None:
            os.chmod(sock_path, 0o600)
        runtime = paths.ensure_private_dir(
            sock_path.parent if sock_path is not None else paths.runtime_dir()
        )
        log_dir = self.settings.log_dir or paths.log_dir()
        self.sup = Supervisor(ctx, runtime, Path(log_dir))
        cache = CachePolicy(
            self.budget_bytes,
            self.settings.max_models,
            time.monotonic,
            failure_cooldown_s=self.settings.failure_cooldown_s,
            default_keep_alive_s=self.settings.keep_alive_s,
            eviction=self.settings.eviction,
        )
        self.sched = Scheduler(self.settings, cache, self.sup, self._send_job)
        self.sched.ensure_spare()
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        log.info(
            "modeld %s serving %s (pid %d); budget %s of %s usable, max %d models",
            __version__,
            self.endpoint,
            os.getpid(),
            format_bytes(self.budget_bytes),
            format_bytes(self.usable_bytes),
            self.settings.max_models,
        )
        door = self._front_door()
        try:
            self._loop()
        finally:
            log.info("shutting down")
            if door is not None:
                door.stop()
            self.sched.shutdown()
            self.sup.close()
            self.sock.close(linger=0)
            ctx.term()
            for s, handler in old.items():
                signal.signal(s, handler)
        log.info("stopped")
        return 0

    def _front_door(self) -> Any:
        """The HTTP front door (Ollama/OpenAI APIs) when ``http`` is not off: a client of this
        daemon's own socket, so it goes through the same requests as the CLI."""
        if self.settings.http_address is None:
            return None
        from modeld.http.serve import start

        return start(self.settings, self.endpoint)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("received %s", signal.Signals(signum).name)
        self.stop_requested = True

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.sup.socket, zmq.POLLIN)
        next_tick = 0.0
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
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + TICK_S
                self._guard(self.sched.tick)

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

    def _send_job(self, job: Job, msg: protocol.Message) -> bool:
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
        req = protocol.parse_request(msg)
        t = msg.type
        reply = self._send
        if t in ("ping", "version"):
            reply(
                client,
                protocol.done(
                    msg.id,
                    pong=True,
                    version=__version__,
                    protocol=protocol.PROTOCOL_VERSION,
                    pid=os.getpid(),
                    endpoint=self.endpoint,
                ),
            )
        elif t == "ps":
            cache = self.sched.cache
            reply(
                client,
                protocol.done(
                    msg.id,
                    models=self.sched.ps_rows(),
                    budget_bytes=cache.budget_bytes,
                    used_bytes=cache.used_bytes(),
                    max_models=cache.max_models,
                ),
            )
        elif t == "stats":
            reply(client, protocol.done(msg.id, **self._stats()))
        elif t == "shutdown":
            reply(client, protocol.done(msg.id, stopping=True))
            self.stop_requested = True
        elif isinstance(req, protocol.CancelRequest):
            found = self.sched.cancel(client, req.target)
            reply(client, protocol.done(msg.id, cancelled=found))
        elif isinstance(req, protocol.UnloadRequest):
            self._unload(client, msg.id, req)
        elif isinstance(req, protocol.ShowRequest):
            reply(client, protocol.done(msg.id, **self._show(req)))
        elif isinstance(
            req,
            protocol.GenerateRequest
            | protocol.EmbedRequest
            | protocol.RerankRequest
            | protocol.LoadRequest,
        ):
            self.sched.submit(self._job(client, msg.id, req))
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
        return "rerank" if info.is_reranker else "generate"

    def _job(
        self,
        client: bytes,
        rid: str,
        req: protocol.GenerateRequest
        | protocol.EmbedRequest
        | protocol.RerankRequest
        | protocol.LoadRequest,
    ) -> Job:
        if not isinstance(req, protocol.LoadRequest):
            key, name = self._key(req.model, req.mode)
            return request_job(client, rid, req, key, name, self.settings)
        key, name = self._key(req.model, self._mode_or_natural(req.model, req.mode))
        self.sched.cache.clear_failure(key)
        keep_alive = keep_alive_of(req.keep_alive, self.settings)
        return Job(client, rid, "load", key, name, {}, keep_alive, requested_ctx(req.n_ctx),
                   req.pinned, parallel=req.parallel)  # fmt: skip

    def _unload(self, client: bytes, rid: str, req: protocol.UnloadRequest) -> None:
        if req.all:
            keys = list(self.sched.slots)
        else:
            from modeld import registry

            path = os.path.realpath(registry.resolve(req.model, self.settings).path)
            keys = [
                k
                for k in self.sched.slots
                if k.path == path and (req.mode is None or k.mode == req.mode)
            ]
            if not keys:
                raise ModelNotFoundError(
                    f"{req.model} is not loaded", hint="see what is loaded with modeld ps"
                )
        now, later = self.sched.unload(keys)
        self._send(client, protocol.done(rid, unloaded=now, unloading_when_idle=later))

    def _show(self, req: protocol.ShowRequest) -> dict[str, Any]:
        from modeld import describe

        key, name = self._key(req.model, self._mode_or_natural(req.model, req.mode))
        sched = self.sched
        slot = sched.slots.get(key)
        out = describe.show_data(
            sched.model_info(key), key, name, sched.cache, sched.baseline, self.settings,
            req.n_ctx, None if slot is None else (slot.parallel, slot.parallel_reason),
        )
        out["loaded"] = sched.row(key) if key in sched.slots else None
        return out

    def _stats(self) -> dict[str, Any]:
        stats = dict(self.sched.cache.stats())
        stats.update(
            uptime_s=time.monotonic() - self.started,
            pid=os.getpid(),
            endpoint=self.endpoint,
            version=__version__,
            usable_bytes=self.usable_bytes,
            memory_fraction=self.settings.memory_fraction,
            memory_cap_bytes=self.settings.memory_cap_bytes,
            runners=len(self.sup.runners),
            runner_stalls=self.sup.stalls,
            runner_baseline_bytes=self.sched.baseline,
            spare_runner=self.sched.spare is not None,
            in_flight=len(self.sched.jobs),
            waiting=sum(len(w.jobs) for w in self.sched.waiting.values()),
        )
        return stats


# ---------------------------------------------------------------------- entry points


def setup_logging(settings: Settings) -> Path:
    """Log to ``<log dir>/modeld.log`` and stderr (systemd captures the latter)."""
    log_dir = Path(settings.log_dir or paths.log_dir())
    log_file = log_dir / "modeld.log"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(log_file)
    except OSError as exc:
        raise unusable_path(exc, "log_dir") from None
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger("modeld")
    root.setLevel(getattr(logging, settings.log_level.upper(), logging.INFO))
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in (file_handler, logging.StreamHandler(sys.stderr)):
        handler.setFormatter(fmt)
        root.addHandler(handler)
    return log_file


def serve(settings: Settings) -> int:
    """Run the daemon in the foreground until SIGINT/SIGTERM or a shutdown request."""
    setup_logging(settings)
    try:
        if settings.http_address is not None:
            from modeld.http.serve import check_exposure

            check_exposure(settings)
        return Daemon(settings).run()
    except DaemonRunningError as exc:
        log.error("%s", exc)
        return 1
    except InvalidRequestError as exc:
        log.error("%s — %s", exc.message, exc.hint)
        return 2


def main(argv: list[str] | None = None) -> int:
    """``python -m modeld.daemon``: the daemon with CLI overrides (used by tests)."""
    p = argparse.ArgumentParser(prog="python -m modeld.daemon", description=__doc__)
    p.add_argument("--socket", help="ZeroMQ endpoint to bind")
    p.add_argument("--memory-cap", type=int, help="budget cap in bytes")
    p.add_argument("--memory-fraction", type=float)
    p.add_argument("--max-models", type=int)
    p.add_argument("--keep-alive", help='default keep-alive ("5m", seconds, 0, -1)')
    p.add_argument("--ctx-floor", type=int)
    p.add_argument("--ctx-ceiling", type=int)
    p.add_argument("--max-message-bytes", type=int)
    p.add_argument("--queue-timeout", type=float)
    p.add_argument("--load-timeout", type=float)
    p.add_argument("--runner-stall", type=float, help="kill a runner silent this many seconds")
    p.add_argument("--http", help='HTTP front door "host:port", or off')
    p.add_argument("--max-queue", type=int, help="waiting requests before new ones are refused")
    p.add_argument("--prompt-cache-mib", type=int, help="prompt snapshots per runner; 0 off")
    p.add_argument("--threads", type=int)
    p.add_argument("--parallel", type=int, help="requests one model decodes together (0: auto)")
    p.add_argument("--no-spare", action="store_true", help="do not pre-start a spare runner")
    p.add_argument("--eviction", choices=("cost", "lru"), help="victim order (default cost)")
    p.add_argument("--log-level")
    p.add_argument("--config", help="config file (TOML)")
    a = p.parse_args(argv)
    overrides: dict[str, object] = {
        "socket": a.socket,
        "memory_cap_bytes": a.memory_cap,
        "memory_fraction": a.memory_fraction,
        "max_models": a.max_models,
        "keep_alive": a.keep_alive,
        "ctx_floor": a.ctx_floor,
        "ctx_ceiling": a.ctx_ceiling,
        "max_message_bytes": a.max_message_bytes,
        "queue_timeout_s": a.queue_timeout,
        "load_timeout_s": a.load_timeout,
        "runner_stall_s": a.runner_stall,
        "http": a.http,
        "max_queue": a.max_queue,
        "prompt_cache_mib": a.prompt_cache_mib,
        "threads": a.threads,
        "parallel": a.parallel,
        "log_level": a.log_level,
        "spare_runner": False if a.no_spare else None,
        "eviction": a.eviction,
    }
    try:
        settings, _ = load_settings(
            {k: v for k, v in overrides.items() if v is not None}, config_path=a.config
        )
    except ModeldError as exc:
        print(f"modeld: {exc}", file=sys.stderr)
        return 2
    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())

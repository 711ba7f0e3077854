"""The modeld daemon process: lock file, sockets, signals, logging, and its entry points.

Its one event loop (:mod:`modeld.daemon.service`) owns all state; loads run in runner
processes and report back as messages, so the loop never blocks on a model. Request
scheduling lives in :mod:`modeld.daemon.scheduler`, runner processes in
:mod:`modeld.daemon.supervisor`.

``modeld serve`` calls :func:`serve`; tests use ``python -m modeld.daemon --socket EP ...``.
"""

from __future__ import annotations

import argparse
import contextlib
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

from modeld import __version__, paths, sizing
from modeld.cache.policy import CachePolicy
from modeld.config import SETTINGS, Settings, load_settings
from modeld.daemon.forkserver import ForkServer
from modeld.daemon.logsafe import QuietFileHandler
from modeld.daemon.service import Service
from modeld.daemon.supervisor import Supervisor
from modeld.errors import (
    InvalidRequestError,
    ModeldError,
    format_bytes,
    unusable_path,
)
from modeld.http import fds
from modeld.model import probe
from modeld.settingvalues import parse_bool

log = logging.getLogger("modeld.daemon")


class DaemonRunningError(ModeldError):
    """Another daemon holds the lock for this socket."""


class Daemon:
    """See the module docstring. Create, then :meth:`run` (returns the exit status)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.endpoint = settings.socket or paths.socket_endpoint()
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
        # the hard limit, not 1,024: libzmq aborts the process when it finds no descriptor
        # (http/fds.py), and the HTTP front door's cap on connections is sized from this
        nofile = fds.raise_limit()
        # before the first thread (ZeroMQ's I/O threads): a process with threads cannot fork
        forks, how = ForkServer.start() if self.settings.runner_fork else (
            None, "runners start as new processes (runner_fork is off)")
        probe.map_big_allocations()  # after the fork: the runners keep glibc's defaults
        ctx: zmq.Context[Any] = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, int(self.settings.max_message_bytes))
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError as exc:  # address in use, a path too long for a unix socket, ...
            if forks is not None:
                forks.stop()
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
        clock = time.monotonic  # one clock for every part: their times are compared
        sup = Supervisor(ctx, runtime, Path(log_dir), clock, forks)
        cache = CachePolicy(
            self.budget_bytes,
            self.settings.max_models,
            clock,
            failure_cooldown_s=self.settings.failure_cooldown_s,
            default_keep_alive_s=self.settings.keep_alive_s,
            eviction=self.settings.eviction,
        )
        service = Service(self.settings, self.endpoint, sock, sup, cache, self.usable_bytes, clock)
        service.sched.ensure_spare()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("received %s", signal.Signals(signum).name)
            service.stop_requested = True

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        log.info(
            "modeld %s serving %s (pid %d); budget %s of %s usable, max %d models",
            __version__,
            self.endpoint,
            os.getpid(),
            format_bytes(self.budget_bytes),
            format_bytes(self.usable_bytes),
            self.settings.max_models,
        )
        log.info("%s; open-file limit %d", how, nofile)
        door = self._front_door()
        if door is not None:  # the port it really has (``modeld launch`` reads it)
            host, port = door.address[:2]
            service.http_address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            service.loop()
        finally:
            log.info("shutting down")
            if door is not None:
                door.stop()
            service.close()
            sup.close()
            sock.close(linger=0)
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



# ---------------------------------------------------------------------- entry points


def setup_logging(settings: Settings) -> Path:
    """Log to ``<log dir>/modeld.log`` and stderr (systemd captures the latter)."""
    log_dir = Path(settings.log_dir or paths.log_dir())
    log_file = log_dir / "modeld.log"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        file_handler = QuietFileHandler(log_file)  # a full disk: one warning, not tracebacks
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


def _parser() -> argparse.ArgumentParser:
    """A flag per setting, from :data:`modeld.config.SETTINGS`: ``--max-models 2``; a synonym
    is a flag too (``--memory-cap``); a true/false setting also has ``--no-…``."""
    p = argparse.ArgumentParser(prog="python -m modeld.daemon", description=__doc__)
    for name, spec in SETTINGS.items():
        flags = [f"--{n.replace('_', '-')}" for n in (name, *spec.synonyms)]
        if spec.parse is parse_bool:
            p.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction,
                           help=spec.help)  # fmt: skip
        else:
            p.add_argument(*flags, dest=name, metavar="VALUE", help=spec.help)
    p.add_argument("--config", help="config file (TOML)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m modeld.daemon``: the daemon with CLI overrides (used by tests)."""
    args = vars(_parser().parse_args(argv))
    config = args.pop("config")
    try:
        settings, _ = load_settings(
            {k: v for k, v in args.items() if v is not None}, config_path=config
        )
    except ModeldError as exc:
        print(f"modeld: {exc}", file=sys.stderr)
        return 2
    return serve(settings)


if __name__ == "__main__":
    sys.exit(main())

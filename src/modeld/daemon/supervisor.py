"""Runner processes: start, talk to, watch and stop them (used only by the daemon's event loop).

Each runner is ``python -m modeld.runner --endpoint EP --id ID`` in its own process, connected to
the one runner ROUTER bound here, so a native crash costs one model and an exit returns all of
its memory to the OS. The supervisor does no policy: the daemon decides which runner loads what.

Liveness: every message from a runner, and the heartbeat its own thread sends every second
(runner/transport.py), counts as a sign of life; a runner silent for ``runner_stall_s`` (stopped,
or stuck holding the GIL) is killed with its whole process group (:meth:`kill_stalled`), and its
exit is then handled like any crash. Work does not count: a long prompt evaluation keeps beating.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import zmq

from modeld.daemon.forkserver import ForkServer
from modeld.model import probe
from modeld.wire import runnerwire
from modeld.wire.protocol import ProtocolError

log = logging.getLogger("modeld.daemon")

#: Seconds a runner gets to exit after ``shutdown`` before it is killed.
STOP_GRACE_S = 5.0


class RunnerProcess(Protocol):
    """What the supervisor needs of a runner's process: a :class:`subprocess.Popen`, or a
    runner forked by the fork server (:class:`modeld.daemon.forkserver.ForkedProcess`)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class RunnerHandle:
    """One runner process as the daemon sees it."""

    id: str
    popen: RunnerProcess
    started_at: float
    ready: bool = False  # hello received
    baseline: dict[str, int] = field(default_factory=dict)
    rpc_supported: bool | None = None  # its hello: built with llama.cpp's RPC backend
    pending: list[dict[str, Any]] = field(default_factory=list)  # sent once hello arrives
    stopping_since: float | None = None
    exit_code: int | None = None
    last_heard: float = 0.0  # any message or heartbeat (monotonic); starts at spawn
    stalled_s: float | None = None  # silent this long when it was killed for it
    devices: list[dict[str, Any]] = field(default_factory=list)  # its hello: llama.cpp's devices
    load_log: Path | None = None  # llama.cpp's lines of its current load (read after a crash)

    @property
    def pid(self) -> int:
        return self.popen.pid


class Supervisor:
    """Owns the runner ROUTER socket and every runner process."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        runtime_dir: Path,
        log_dir: Path,
        clock: Callable[[], float] = time.monotonic,
        forks: ForkServer | None = None,
    ) -> None:
        self._clock = clock  # the scheduler's clock too: it compares runners' times with it
        self.forks = forks  # runners start as its forks while it answers
        self.endpoint = f"ipc://{runtime_dir / f'runners-{os.getpid()}.sock'}"
        self._sock_path = runtime_dir / f"runners-{os.getpid()}.sock"
        with contextlib.suppress(FileNotFoundError):
            self._sock_path.unlink()
        self.socket: zmq.Socket[Any] = ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.socket.bind(self.endpoint)
        self.log_dir = log_dir
        self.runners: dict[str, RunnerHandle] = {}
        self._ids = itertools.count(1)
        self.stalls = 0  # runners killed for silence since start

    def spawn(self, fork: bool = True) -> RunnerHandle:
        """Start a runner process (a fork of the fork server while it answers, unless ``fork``
        is false); messages for it queue until its ``hello`` arrives."""
        rid = f"r{next(self._ids)}"
        log_path = self.log_dir / f"runner-{rid}.log"
        load_log = self.log_dir / f"runner-{rid}.load.log"
        args = self._runner_args(rid, load_log)
        forked = self.forks.fork(rid, args, log_path) if self.forks and fork else None
        popen = forked or self._popen(args, log_path)
        now = self._clock()
        runner = RunnerHandle(rid, popen, now, last_heard=now, load_log=load_log)
        self.runners[rid] = runner
        log.info("started runner %s (pid %d%s), log %s", rid, popen.pid,
                 ", forked" if forked else "", log_path)  # fmt: skip
        return runner

    def _runner_args(self, rid: str, load_log: Path) -> list[str]:
        """The runner's arguments, whichever way it starts (:func:`modeld.runner.main.main`)."""
        return ["--endpoint", self.endpoint, "--id", rid, "--parent-pid", str(os.getpid()),
                "--load-log", str(load_log)]  # fmt: skip

    def _popen(self, args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        """A runner as a new Python process (no fork server, or it failed)."""
        with open(log_path, "ab") as log_file:
            return subprocess.Popen(
                [sys.executable, "-m", "modeld.runner", *args],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a stall kill takes all of it
                close_fds=True,
            )

    def fork_server_pid(self) -> int | None:
        """The fork server's pid while it runs (None after an idle stop or a failure)."""
        return self.forks.pid if self.forks is not None and self.forks.alive else None

    def forking(self) -> bool:
        """Whether runners start as forks (the fork server runs, or starts again on demand)."""
        return self.forks is not None and not self.forks.failed

    def stop_idle_fork_server(self, idle_s: float) -> None:
        """The fork server exits once no runner was forked for ``idle_s`` seconds, and this
        process, as idle, gives its free heap back too (~1 MiB; bench tree_memory)."""
        if self.forks is not None and self.forks.stop_if_idle(idle_s):
            probe.malloc_trim()

    def send(self, runner_id: str, msg: dict[str, Any]) -> bool:
        """Send ``msg`` (queued until hello); False if the runner is gone or unreachable."""
        runner = self.runners.get(runner_id)
        if runner is None:
            return False
        if not runner.ready:
            runner.pending.append(msg)
            return True
        try:
            self.socket.send_multipart([runner_id.encode(), *runnerwire.encode(msg)])
        except zmq.ZMQError as exc:
            log.warning("cannot send %s to runner %s: %s", msg.get("type"), runner_id, exc)
            return False
        return True

    def receive(self) -> tuple[RunnerHandle, dict[str, Any]] | None:
        """One message from a runner (``hello`` handled here), or None if it was dropped."""
        frames = self.socket.recv_multipart()
        ident = frames[0].decode("utf-8", "replace")
        if ident.endswith(runnerwire.HEARTBEAT_SUFFIX):
            beating = self.runners.get(ident.removesuffix(runnerwire.HEARTBEAT_SUFFIX))
            if beating is not None:
                beating.last_heard = self._clock()
            return None
        runner = self.runners.get(ident)
        if runner is not None:
            runner.last_heard = self._clock()
        if runner is None:
            log.warning("dropping message from unknown runner %r", ident)
            return None
        try:
            msg = runnerwire.decode(frames[1:])
        except ProtocolError as exc:
            log.warning("dropping malformed message from runner %s: %s", ident, exc)
            return None
        if msg["type"] == "hello":
            runner.ready = True
            baseline = msg.get("baseline")
            if isinstance(baseline, dict):
                runner.baseline = {k: int(v) for k, v in baseline.items() if isinstance(v, int)}
            rpc_ok = msg.get("rpc_supported")
            runner.rpc_supported = rpc_ok if isinstance(rpc_ok, bool) else None
            devices = msg.get("devices")
            if isinstance(devices, list):
                runner.devices = [d for d in devices if isinstance(d, dict)]
            pending, runner.pending = runner.pending, []
            for queued in pending:
                self.send(ident, queued)
        return runner, msg

    def stop(self, runner_id: str) -> None:
        """Ask a runner to exit; :meth:`reap` kills it if it is still alive after the grace."""
        runner = self.runners.get(runner_id)
        if runner is None or runner.stopping_since is not None:
            return
        runner.stopping_since = self._clock()
        if runner.ready:
            self.send(runner_id, runnerwire.shutdown())
        else:  # not even connected yet: nothing to be polite to
            self._kill(runner)

    def reap(self) -> list[RunnerHandle]:
        """Runners that exited since the last call (removed); kills those past the grace."""
        gone: list[RunnerHandle] = []
        now = self._clock()
        for runner in list(self.runners.values()):
            code = runner.popen.poll()
            if code is None:
                if runner.stopping_since is not None and now - runner.stopping_since > STOP_GRACE_S:
                    log.warning(
                        "runner %s did not exit in %.0f s; killing", runner.id, STOP_GRACE_S
                    )
                    self._kill(runner)
                continue
            runner.exit_code = code
            del self.runners[runner.id]
            gone.append(runner)
        return gone

    def responsive(self, runner: RunnerHandle) -> bool:
        """Heard from within a few heartbeat periods (a spare about to be given a load). One
        still starting (no hello yet; importing llama_cpp can take seconds on a busy machine)
        is given the benefit of the doubt: :meth:`kill_stalled` catches it if it never talks."""
        if not runner.ready:
            return True
        return self._clock() - runner.last_heard < 3 * runnerwire.HEARTBEAT_S

    def kill_stalled(self, stall_s: float) -> list[RunnerHandle]:
        """Kill (with their process groups) the runners silent for more than ``stall_s``; their
        exits come back from :meth:`reap` with ``stalled_s`` set."""
        now = self._clock()
        killed: list[RunnerHandle] = []
        for runner in self.runners.values():
            silent = now - runner.last_heard
            if runner.stalled_s is None and runner.popen.poll() is None and silent > stall_s:
                runner.stalled_s = silent
                self.stalls += 1
                log.error("runner %s (pid %d) silent for %.1f s: killing its process group",
                          runner.id, runner.pid, silent)
                self._kill(runner)
                killed.append(runner)
        return killed

    def kill(self, runner_id: str) -> None:
        """SIGKILL a runner's process group now (its exit comes back from :meth:`reap`)."""
        runner = self.runners.get(runner_id)
        if runner is not None:
            self._kill(runner)

    def _kill(self, runner: RunnerHandle) -> None:
        """SIGKILL the runner's process group (it leads one: ``start_new_session``); a stopped
        process dies of SIGKILL too."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(runner.pid, 9)
        with contextlib.suppress(ProcessLookupError):
            runner.popen.kill()

    def close(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every runner (shutdown, then kill after ``grace_s``) and close the socket."""
        for rid in list(self.runners):
            self.stop(rid)
        deadline = self._clock() + grace_s
        for runner in list(self.runners.values()):
            try:
                runner.popen.wait(max(0.0, deadline - self._clock()))
            except subprocess.TimeoutExpired:
                self._kill(runner)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    runner.popen.wait(2.0)
        self.runners.clear()
        if self.forks is not None:
            self.forks.stop()
        self.socket.close(linger=0)
        with contextlib.suppress(FileNotFoundError):
            self._sock_path.unlink()

"""The daemon's side of the runner fork server (:mod:`modeld.runner.zygote`).

Started once, before the daemon creates its ZeroMQ context (a process may only be forked
safely while it has one thread). Runners then start as forks of a process that has imported
llama_cpp: they share its pages and the daemon's copy-on-write and start in milliseconds.

Not used (the supervisor starts ``python -m modeld.runner`` as before) when ``runner_fork``
is off, off Linux, when the daemon already has threads, when the installed llama.cpp has a GPU
backend (CUDA and its peers must not be initialised in a parent that forks; a runner forked
after the parent touched them would fail), or once the fork server stops answering.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import importlib.util
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from modeld.runner import zygote

log = logging.getLogger("modeld.daemon")

#: How long the first fork waits for the fork server's imports (half a second when idle; the
#: daemon's start-up asks for its spare runner, so it is the daemon's start that waits).
READY_WAIT_S = 20.0
#: How long one fork may take before the fork server counts as stuck (the daemon's loop waits:
#: a fork takes milliseconds).
FORK_WAIT_S = 2.0
#: prctl option that makes orphaned descendants children of this process (Linux >= 3.4).
PR_SET_CHILD_SUBREAPER = 36
#: llama.cpp backend libraries that must not be loaded in a process that forks runners.
GPU_BACKENDS = ("cuda", "hip", "vulkan", "metal", "sycl", "musa", "opencl", "cann", "kompute")


class ForkedProcess:
    """A runner forked by the fork server and re-parented to the daemon: the part of
    :class:`subprocess.Popen` the supervisor uses (pid, poll, kill, wait)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: nothing more to learn
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"runner pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return code


class ForkServer:
    """The fork server process as the daemon sees it: start, fork a runner, stop."""

    def __init__(self, proc: ForkedProcess | subprocess.Popen[bytes], requests: int,
                 replies: int) -> None:
        self.failed = False  # it stopped answering: runners start as new processes from now on
        self._attach(proc, requests, replies)

    def _attach(self, proc: ForkedProcess | subprocess.Popen[bytes], requests: int,
                replies: int) -> None:
        """Talk to ``proc`` through these pipe ends from now on."""
        self._proc = proc
        self._requests = requests
        self._replies = replies
        self._buffer = b""
        self.ready = False
        self.alive = True  # running; after an idle stop the next fork starts it again
        self.last_used = time.monotonic()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @classmethod
    def start(cls) -> tuple[ForkServer | None, str]:
        """Fork the fork server from this process, or None where it cannot be used (then
        runners start as ``python -m modeld.runner``); and a line for the log saying which."""
        why = unusable()
        if why is None and not _become_subreaper():
            why = "prctl(PR_SET_CHILD_SUBREAPER) failed"
        if why is not None:
            return None, f"runners start as new processes (fork server not used: {why})"
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        # what both sides imported stays in pages they share: no collection writes to it
        gc.collect()
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            os.close(req_w)
            os.close(rep_r)
            zygote.serve(req_r, rep_w)  # never returns
        os.close(req_r)
        os.close(rep_w)
        return cls(ForkedProcess(pid), req_w, rep_r), (
            f"runners are forked from the fork server (pid {pid})")

    def _respawn(self) -> None:
        """Start the fork server again after an idle stop: this process has threads by now,
        so as a new Python process (``python -m modeld.runner.zygote``) rather than a fork; its
        imports take ~0.2 s, which the first fork waits for."""
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "modeld.runner.zygote", str(req_r), str(rep_w)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(req_r, rep_w))  # fmt: skip
        except OSError:
            os.close(req_w)
            os.close(rep_r)
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)
        self._attach(proc, req_w, rep_r)
        log.info("runner fork server started again (pid %d)", proc.pid)

    def fork(self, runner_id: str, args: list[str], log_path: Path) -> ForkedProcess | None:
        """A new runner process running the runner's main with ``args``, or None when the fork
        server failed (it is then stopped and not used again: the caller starts the runner the
        other way)."""
        if self.failed:
            return None
        try:
            if not self.alive:
                self._respawn()
            if not self.ready:
                self.ready = bool(self._read(READY_WAIT_S).get("ready"))
            os.write(self._requests, zygote.encode(
                {"id": runner_id, "argv": args, "log": str(log_path)}))
            reply = self._read(FORK_WAIT_S)
        except (OSError, ValueError, TimeoutError) as exc:
            self._fail(f"runner fork server failed ({exc}); starting runners as new processes")
            return None
        pid = reply.get("pid")
        if reply.get("id") != runner_id or not isinstance(pid, int):
            self._fail(f"runner fork server answered {reply!r}; starting runners as new processes")
            return None
        self.last_used = time.monotonic()
        return ForkedProcess(pid)

    def _fail(self, why: str) -> None:
        log.warning("%s", why)
        self.failed = True
        self.stop(grace_s=0.0)

    def stop_if_idle(self, idle_s: float) -> bool:
        """Stop it once no runner was forked for ``idle_s`` seconds: the pages it holds only
        for itself (~10 MiB: the originals of what its runners wrote to) go back to the
        system, and the next fork starts it again. True if it stopped now."""
        if not self.alive or not self.ready or time.monotonic() - self.last_used < idle_s:
            return False
        pid = self.pid
        self.stop()
        log.info("runner fork server (pid %d) stopped after %.0f s without a fork; the next"
                 " runner starts it again", pid, idle_s)  # fmt: skip
        return True

    def _read(self, timeout: float) -> dict[str, Any]:
        """The next reply line, waiting at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                raise TimeoutError(f"no answer in {timeout:.0f} s")
            chunk = os.read(self._replies, 4096)
            if not chunk:
                raise OSError("the fork server exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return zygote.decode(line)

    def stop(self, grace_s: float = 2.0) -> None:
        """Close its request pipe (it exits on that), then reap it; kill it if it lingers (at
        once with ``grace_s`` 0: a fork server that failed may be stopped or stuck)."""
        if not self.alive:
            return
        self.alive = False
        for fd in (self._requests, self._replies):
            with contextlib.suppress(OSError):
                os.close(fd)
        proc = self._proc
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2.0)


def unusable() -> str | None:
    """Why a fork server cannot be used in this process now, or None."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if threading.active_count() > 1 or len(os.listdir("/proc/self/task")) > 1:
        return "the daemon already runs threads"
    gpu = gpu_backends()
    if gpu:
        return f"llama.cpp has GPU backends ({', '.join(gpu)}), which do not survive a fork"
    return None


def gpu_backends() -> list[str]:
    """The GPU backend libraries beside the installed llama_cpp (found without importing it)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return []
    found: set[str] = set()
    for root in spec.submodule_search_locations:
        lib = Path(root) / "lib"
        names = [p.name.lower() for p in lib.iterdir()] if lib.is_dir() else []
        found.update(b for b in GPU_BACKENDS for n in names if n.startswith(f"libggml-{b}"))
    return sorted(found)


def _become_subreaper() -> bool:
    """Make orphaned descendants (the fork server's runners) children of this process."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False

"""The runner fork server's own side: import the runner once, then fork a runner per request.

The daemon forks this process from itself at start (:mod:`modeld.daemon.forkserver`), before it
creates any thread. Here it imports what a runner imports (llama_cpp, numpy, jinja2, ...),
freezes those objects out of the garbage collector's reach and waits on a pipe. Each runner it
forks shares the interpreter, the daemon's modules and those imports with it copy-on-write
instead of paying ~30 MiB of private memory per process for its own (docs/benchmarks.md,
tree_memory), and starts in milliseconds instead of half a second.

A runner is forked twice (the middle process exits at once) so that it is re-parented to the
daemon, which made itself a child subreaper: the daemon waits for its runners' exit codes and
kills their process groups exactly as for runners it started with ``subprocess``.

Wire (two pipes, one JSON object per line): the daemon sends ``{"id", "argv", "log"}`` (the
runner's arguments, as for ``python -m modeld.runner``); this process answers
``{"ready": true}`` once after its imports, then ``{"id", "pid"}`` or ``{"id", "error"}`` per
request. It exits when the request pipe closes: at the daemon's exit, or once no runner was
forked for ``runner_fork_idle_s``; the daemon then starts it again as a new process
(:func:`main`) when it next needs a runner.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import logging
import os
import signal
import sys
import time
import traceback
import types
from typing import Any

#: A forked runner waits this long to be re-parented to the daemon before it gives up.
REPARENT_WAIT_S = 5.0


def encode(msg: dict[str, Any]) -> bytes:
    """One wire message: a JSON object on one line."""
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """One wire message back; ValueError if it is not a JSON object."""
    msg = json.loads(line)
    if not isinstance(msg, dict):
        raise ValueError(f"not a fork-server message: {line[:80]!r}")
    return msg


def serve(requests: int, replies: int) -> None:
    """The fork server's life after the daemon forked it (never returns)."""
    code = 0
    try:
        _detach(keep=(requests, replies))
        _leave_out_unused_imports()
        from modeld.runner import main  # noqa: F401  (llama_cpp, numpy, jinja2, ...)

        gc.collect()
        gc.freeze()  # the imported objects stay in shared pages: collections never touch them
        from modeld.model import probe

        probe.malloc_trim()  # free heap pages go back to the OS, not into every runner
        os.write(replies, encode({"ready": True}))
        with os.fdopen(requests, "rb", buffering=0) as pipe:
            for line in iter(pipe.readline, b""):
                os.write(replies, encode(_fork_runner(decode(line), replies)))
    except BaseException:  # this process must never return into the daemon's code
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _leave_out_unused_imports() -> None:
    """Keep what runners never use out of the pages every runner maps: OpenSSL's libcrypto
    (hashlib falls back to Python's own hashes; runners hash only short strings, jinja2 imports
    hashlib for a cache it is not given) and diskcache with sqlite3 (llama_cpp's optional disk
    cache, imported when llama_cpp is): about 4 MiB of the tree (bench tree_memory)."""
    sys.modules.setdefault("_hashlib", None)  # type: ignore[arg-type]
    if "diskcache" not in sys.modules:
        sys.modules["diskcache"] = _OnFirstUse("diskcache")


class _OnFirstUse(types.ModuleType):
    """A module imported when one of its attributes is first read."""

    def __getattr__(self, name: str) -> Any:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), name)


def _detach(keep: tuple[int, ...]) -> None:
    """Leave the daemon's session, descriptors, logging and signal handlers behind."""
    os.setsid()  # a Ctrl-C to the daemon's terminal does not reach the fork server
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    keep_all = sorted({0, 1, 2, *keep})
    low = 3
    for fd in [*keep_all, 1 << 16]:
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    for name in ("", "modeld"):  # the daemon's handlers write to descriptors now closed
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET if name else logging.WARNING)


def _fork_runner(req: dict[str, Any], replies: int) -> dict[str, Any]:
    """Fork a runner for ``req`` (through a middle process that exits); its pid, or an error."""
    rid = str(req.get("id", "?"))
    daemon = os.getppid()  # this process's parent: the runner's once the middle one exits
    pid_r, pid_w = os.pipe()
    middle = os.fork()
    if middle == 0:  # the middle process: fork the runner, say its pid, exit
        os.close(pid_r)
        try:
            runner = os.fork()
            if runner == 0:
                os.close(pid_w)
                _become_runner(req, daemon, closing=(replies,))
            os.write(pid_w, str(runner).encode())
        finally:
            os._exit(0)
    os.close(pid_w)
    with os.fdopen(pid_r, "rb") as pipe:
        said = pipe.read()
    os.waitpid(middle, 0)  # once it is reaped, the runner's parent is the daemon
    try:
        return {"id": rid, "pid": int(said)}
    except ValueError:
        return {"id": rid, "error": "the fork server could not fork a runner"}


def _become_runner(req: dict[str, Any], daemon: int, closing: tuple[int, ...]) -> None:
    """In the forked runner: own session, log file as output, then the runner's main."""
    code = 1
    try:
        for fd in closing:
            os.close(fd)
        os.setsid()  # its own process group: a stall kill takes all of it
        log_fd = os.open(str(req["log"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        deadline = time.monotonic() + REPARENT_WAIT_S
        while os.getppid() != daemon and time.monotonic() < deadline:
            time.sleep(0.001)
        if os.getppid() != daemon:
            print(f"runner not re-parented to the daemon (pid {daemon}); exiting", file=sys.stderr)
            os._exit(1)
        set_title(f"modeld.runner --id {req['id']}")
        from modeld.runner.main import main

        code = main([str(a) for a in req["argv"]])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # never return into the fork server's loop
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def set_title(title: str) -> None:
    """Rewrite this process's command line (``ps``, /proc/PID/cmdline) in place: a forked
    runner would otherwise show the daemon's. Cut to the space the original took."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        size = end - start
        if size <= 1:
            return
        data = title.encode()[: size - 1]
        ctypes.memmove(start, data + b"\0" * (size - len(data)), size)


def main(argv: list[str]) -> None:
    """``python -m modeld.runner.zygote REQUESTS_FD REPLIES_FD``: the fork server started again
    as a new process after an idle stop (the daemon has threads then and cannot fork it)."""
    set_title("modeld fork-server")  # not "modeld.runner ...": that names runners in ps
    serve(int(argv[0]), int(argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])

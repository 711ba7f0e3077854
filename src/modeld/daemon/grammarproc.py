"""Big grammars built in a child process at the lowest CPU priority (issue 35).

A 50,000-word enum is 0.5-0.8 s of Python. Built on a daemon thread, it took one of a 2-core
machine's cores from the runners' llama.cpp threads, which spin-wait for each other, and a
stream beside it stalled 0.5-1 s. Lowering the thread's priority cannot help: every runner
leads a session of its own, and on Linux each session is an autogroup the kernel shares the
CPU between fairly, whatever its members' nice values. So a big input is built by
``python -m modeld.daemon.grammarproc`` in a session of its own with its autogroup and its
nice at 19: it gets the CPU the runners leave. Its answer (the grammar, or the request's
ModeldError with message, hint and details) and its log lines come back pickled on stdout.
Small inputs stay on the calling thread: a child costs about 0.2 s to start. A child whose
caller left is killed (issue 45: three abandoned 8 MB enums went on building for 13 minutes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from modeld.daemon import grammar
from modeld.daemon.builds import Cancel
from modeld.errors import CancelledError, InvalidRequestError
from modeld.wire.messages import Tool

log = logging.getLogger("modeld.daemon")

#: Inputs whose pickle is at least this long are built in a child (a 6,000-word enum: its
#: build is about 0.08 s on a thread, the child's start 0.2 s).
CHILD_FROM = 64 * 1024
#: Niceness of the child, and of its autogroup on Linux.
NICENESS = 19
_live: set[subprocess.Popen[bytes]] = set()
_live_lock = threading.Lock()


def big(fmt: str | dict[str, Any] | None, tools: Sequence[Tool]) -> bool:
    """Whether the input holds at least :data:`CHILD_FROM` bytes of text (keys, strings; 8 a
    number): built in a child, on the lane of big builds. Stops counting there: a 700,000-word
    enum is known big after its first few thousand words."""
    seen = 0
    stack: list[Any] = [fmt, *(t.schema() for t in tools)]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            seen += sum(len(k) + 2 for k in item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            seen += len(item) + 2 if isinstance(item, str) else 8
        if seen >= CHILD_FROM:
            return True
    return False


def for_request(fmt: str | dict[str, Any] | None, tools: Sequence[Tool], tool_choice: str,
                family: str = "generic", max_bytes: int = grammar.MAX_GRAMMAR_BYTES,
                cancel: Cancel | None = None) -> str | None:
    """:func:`modeld.daemon.grammar.for_request`, in a low-priority child when the input is
    :func:`big` (killed when ``cancel`` is set)."""
    if not big(fmt, tools):
        return grammar.for_request(fmt, tools, tool_choice, family, max_bytes)
    grammar.check_bounds(fmt, tools, max_bytes)  # too many constants: refused without a child
    data = pickle.dumps((fmt, tuple(tools), tool_choice, family, max_bytes),
                        pickle.HIGHEST_PROTOCOL)
    return _in_child(data, cancel or Cancel())


def _in_child(data: bytes, cancel: Cancel) -> str | None:
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, start_new_session=True, close_fds=True)
    with _live_lock:
        _live.add(proc)
    cancel.on_cancel(proc.kill)
    try:
        out, _ = proc.communicate(data)
    except OSError:  # killed while its input was written (its caller left)
        out = b""
    finally:
        with _live_lock:
            _live.discard(proc)
        proc.wait()
    if cancel.cancelled:
        log.info("a grammar build from %d bytes of input stopped: its caller left", len(data))
        raise CancelledError("request cancelled")
    try:
        ok, value, records = pickle.loads(out)
    except Exception:  # killed (the daemon is stopping), or it crashed: its stderr is the log's
        raise InvalidRequestError(
            f"the grammar could not be built: its builder process exited with {proc.returncode}",
            hint="simplify the schema, or send 'format': 'json'") from None
    for name, level, text in records:
        logging.getLogger(name).log(level, "%s", text)
    log.info("a grammar from %d bytes of input built in a child in %.2f s", len(data),
             time.monotonic() - t0)
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


def stop_all() -> None:
    """Kill every child still building (the daemon is stopping; their requests are answered)."""
    with _live_lock:
        for proc in _live:
            with contextlib.suppress(OSError):
                proc.kill()


def lower_priority() -> None:
    """This process at the lowest CPU priority: its nice, and on Linux its autogroup's (a new
    session is a new autogroup; the kernel takes one change of an autogroup's nice a tenth of a
    second, machine-wide, so a busy moment is tried again)."""
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    if not os.path.exists("/proc/self/autogroup"):
        return
    for _ in range(5):
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(NICENESS))
            return
        except BlockingIOError:  # EAGAIN: another change within the last 0.1 s
            time.sleep(0.11)
        except OSError:
            return


class _Collect(logging.Handler):
    """The child's log lines, handed back to the daemon's log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.name, record.levelno, record.getMessage()))


def _main() -> None:
    lower_priority()
    collect = _Collect()
    root = logging.getLogger("modeld")
    root.addHandler(collect)
    root.setLevel(logging.INFO)
    fmt, tools, tool_choice, family, max_bytes = pickle.load(sys.stdin.buffer)
    answer: tuple[bool, Any]
    try:
        answer = (True, grammar.for_request(fmt, tools, tool_choice, family, max_bytes))
    except Exception as exc:  # a ModeldError is the request's answer; others the daemon logs
        answer = (False, exc)
    try:
        out = pickle.dumps((*answer, collect.records), pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # an exception that does not pickle: its type and text
        out = pickle.dumps((False, RuntimeError(f"{type(answer[1]).__name__}: {exc}"),
                            collect.records))
    sys.stdout.buffer.write(out)
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    _main()

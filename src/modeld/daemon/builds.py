"""Work the event loop hands to threads: a request's grammar, and the validation of its
complete reply (issue 35). A big grammar's thread only waits: the build runs in a low-priority
child (:mod:`modeld.daemon.grammarproc`).

Turning a JSON Schema into a grammar and having llama.cpp's parser check it is bounded
(:mod:`modeld.schema`) but not free: a 50,000-value enum is about a second of Python and a
0.4 s parse. Built in the loop, that froze every stream's chunks and ``modeld ps`` for as long.
Validating a long reply against its schema (:mod:`modeld.daemon.replycheck`) is the same kind of
work. Here it runs on thread pools; the loop learns of a finished build through a pipe it
polls, and carries on with the request (or its error) itself, so all state stays the loop's.

Two lanes (issue 45): big inputs (a grammar built in a child, a long reply's validation) on
one pool, everything else on the other, so a small ``format`` request never waits behind
another caller's giant schema (two abandoned 8 MB enums once made one take 91 s instead of
0.9). A build whose caller leaves is cancelled: its :class:`Cancel` runs its hooks (a child
building its grammar is killed), and its request ends as cancelled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from modeld.errors import ModeldError

log = logging.getLogger("modeld.daemon")

#: Threads building small grammars (and checking short replies) at once, and the threads of
#: the lane for big ones (each waits on a child: :mod:`modeld.daemon.grammarproc`).
WORKERS = 2
LARGE_WORKERS = 2
#: Grammars longer than this (characters) are followed by a malloc_trim.
TRIM_AFTER = 100_000
T = TypeVar("T")


class Cancel:
    """Set when a build's caller leaves: the work registers what stops it (kill its child)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []
        self.cancelled = False

    def on_cancel(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` when the build is cancelled (now, when it is already)."""
        with self._lock:
            if not self.cancelled:
                self._hooks.append(hook)
                return
        hook()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception:  # a child already gone: nothing to stop
                log.debug("a cancel hook failed", exc_info=True)


@dataclass(eq=False)
class Build(Generic[T]):
    """One request waiting for work done on a thread (its grammar, its reply's validation)."""

    client: bytes
    rid: str
    then: Callable[[T], None]  # on the loop: carry on with the result
    fail: Callable[[ModeldError], None]  # on the loop: answer the request with an error
    cancelled: bool = False
    result: T | None = None
    error: BaseException | None = None
    token: Cancel = field(default_factory=Cancel)  # what the work checks and hooks


class Builds:
    """Pending builds, the pool that runs them and the pipe that wakes the loop."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="modeld-grammar")
        self._large = ThreadPoolExecutor(LARGE_WORKERS, thread_name_prefix="modeld-grammar-big")
        self._done: queue.SimpleQueue[Build[Any]] = queue.SimpleQueue()
        self.wake_fd, self._wake_w = os.pipe()
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self._wake_w, False)
        self.pending: dict[tuple[bytes, str], Build[Any]] = {}

    def start(self, build: Build[T], work: Callable[[], T], *, big: bool = False) -> None:
        """Run ``work`` on a thread (``big``: on the lane of big inputs)."""
        self.pending[(build.client, build.rid)] = build
        future = (self._large if big else self._pool).submit(self._unless_cancelled, build, work)
        future.add_done_callback(lambda f: self._finished(build, f, big))

    @staticmethod
    def _unless_cancelled(build: Build[T], work: Callable[[], T]) -> T | None:
        """``work``, not started when its caller left while it waited for a thread."""
        return None if build.token.cancelled else work()

    def _finished(self, build: Build[T], future: Future[T | None],
                  big: bool = False) -> None:  # a pool thread
        try:
            build.result = future.result()
        except BaseException as exc:  # handed to the loop, which answers it
            build.error = exc
        if big or (isinstance(build.result, str) and len(build.result) > TRIM_AFTER):
            # a big schema's tree and rules are garbage now: give their pages back to the OS
            # (the daemon kept 81 MiB after a 50,000-word enum without this; 65 MiB after a
            # refused 700,000-word one: its request's strings)
            from modeld.model import probe

            probe.malloc_trim()
        self._done.put(build)
        with contextlib.suppress(BlockingIOError):  # a full pipe: the loop is due to drain it
            os.write(self._wake_w, b"x")

    def drain(self) -> None:
        """On the loop: carry on with every finished build."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_fd, 4096):
                pass
        while True:
            try:
                build = self._done.get_nowait()
            except queue.Empty:
                return
            self.pending.pop((build.client, build.rid), None)
            self._settle(build)

    def _settle(self, build: Build[Any]) -> None:
        from modeld.errors import CancelledError

        if build.cancelled:
            build.fail(CancelledError("request cancelled"))
        elif isinstance(build.error, ModeldError):
            build.fail(build.error)
        elif build.error is not None:
            log.error("building a grammar failed", exc_info=build.error)
            from modeld.errors import InvalidRequestError

            build.fail(InvalidRequestError(
                f"the grammar could not be built: {type(build.error).__name__}",
                hint="simplify the schema, or send 'format': 'json'"))
        else:
            build.then(build.result)

    def cancel(self, client: bytes, rid: str | None = None) -> bool:
        """Mark ``client``'s build ``rid`` (every one of its builds when None) cancelled: its
        request ends as cancelled when the build finishes."""
        found = False
        for (who, which), build in self.pending.items():
            if who == client and (rid is None or which == rid):
                build.cancelled = found = True
                build.token.cancel()
        return found

    def clients(self) -> set[bytes]:
        """The clients with a build pending (probed for having left, as queued requests are)."""
        return {who for who, _ in self.pending}

    def close(self, why: ModeldError) -> None:
        """Answer every pending build with ``why`` and stop the pool (its threads finish their
        current build and exit; nothing waits for them, and the pipe stays open for their
        last write: the process is ending)."""
        for build in list(self.pending.values()):
            build.token.cancel()
            build.fail(why)
        self.pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._large.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, Any]:
        return {"grammar_builds": len(self.pending)}

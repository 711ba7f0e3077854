"""Work the event loop hands to threads: a request's grammar, and the validation of its
complete reply (issue 35). A big grammar's thread only waits: the build runs in a low-priority
child (:mod:`modeld.daemon.grammarproc`).

Turning a JSON Schema into a grammar and having llama.cpp's parser check it is bounded
(:mod:`modeld.schema`) but not free: a 50,000-value enum is about a second of Python and a
0.4 s parse. Built in the loop, that froze every stream's chunks and ``modeld ps`` for as long.
Validating a long reply against its schema (:mod:`modeld.daemon.replycheck`) is the same kind of
work. Here it runs on a small thread pool; the loop learns of a finished build through a pipe
it polls, and carries on with the request (or its error) itself, so all state stays the loop's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from modeld.errors import ModeldError

log = logging.getLogger("modeld.daemon")

#: Threads building grammars at once (the loop itself never waits for one).
WORKERS = 2
#: Grammars longer than this (characters) are followed by a malloc_trim.
TRIM_AFTER = 100_000
T = TypeVar("T")


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


class Builds:
    """Pending builds, the pool that runs them and the pipe that wakes the loop."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="modeld-grammar")
        self._done: queue.SimpleQueue[Build[Any]] = queue.SimpleQueue()
        self.wake_fd, self._wake_w = os.pipe()
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self._wake_w, False)
        self.pending: dict[tuple[bytes, str], Build[Any]] = {}

    def start(self, build: Build[T], work: Callable[[], T]) -> None:
        self.pending[(build.client, build.rid)] = build
        future = self._pool.submit(work)
        future.add_done_callback(lambda f: self._finished(build, f))

    def _finished(self, build: Build[T], future: Future[T]) -> None:  # a pool thread
        try:
            build.result = future.result()
        except BaseException as exc:  # handed to the loop, which answers it
            build.error = exc
        if isinstance(build.result, str) and len(build.result) > TRIM_AFTER:
            # a big schema's tree and rules are garbage now: give their pages back to the OS
            # (the daemon kept 81 MiB after a 50,000-word enum without this)
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
        return found

    def close(self, why: ModeldError) -> None:
        """Answer every pending build with ``why`` and stop the pool (its threads finish their
        current build and exit; nothing waits for them, and the pipe stays open for their
        last write: the process is ending)."""
        for build in list(self.pending.values()):
            build.fail(why)
        self.pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, Any]:
        return {"grammar_builds": len(self.pending)}

"""One decode call of the batch engine (runner/batch.py) and what its failure ends.

A call that llama.cpp fails ends the requests in it with the error (their cells are unknown:
forgotten) while the other sequences go on. In a shared pool of cells (``kv_unified``) a call
that found no cells wrote nothing: room is made (runner/kvpool.py) and the call repeated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from modeld.errors import ErrorCode
from modeld.runner import kvpool, resume
from modeld.wire import runnerwire as rp

if TYPE_CHECKING:
    from modeld.runner.generation import DecodeBatch, PromptState
    from modeld.runner.stream import Stream

log = logging.getLogger("modeld.runner")

R = TypeVar("R")  # what a decode row carries beside its stream (a prompt piece, a token)
T = TypeVar("T")  # what filling the batch with rows gives back (their logits rows)


class Engine(resume.Engine, Protocol):
    """What a decode call needs of :class:`modeld.runner.batch.BatchEngine`."""

    batch: DecodeBatch
    states: list[PromptState]
    unified: bool

    def end(self, stream: Stream, reply: Mapping[str, Any]) -> None: ...


def decode(
    engine: Engine, rows: list[tuple[Stream, R]], fill: Callable[[list[tuple[Stream, R]]], T],
    wait: Callable[[list[tuple[Stream, R]]], None] | None = None,
) -> tuple[list[tuple[Stream, R]], T | None]:
    """Evaluate ``rows`` (``fill`` adds them to the batch): the rows evaluated and what
    ``fill`` returned for them (none: nothing was). ``wait``: puts back rows that may wait
    for the next step (prompt pieces) when the shared pool is full."""
    while rows:
        filled = fill(rows)
        try:
            if engine.batch.try_decode() == 0:
                return rows, filled
            if not engine.unified:
                raise RuntimeError("llama_decode found no KV cells for the batch")
        except Exception as exc:
            log.exception("a decode of %d sequence(s) failed", len(rows))
            for stream, _ in rows:
                stream.state.failed()
                engine.end(stream, rp.error(stream.rid, ErrorCode.INTERNAL,
                                            f"{type(exc).__name__}: {exc}"))
            return [], None
        room = kvpool.make_room(engine.states, engine.streams, [s for s, _ in rows],
                                prompt=wait is not None)
        if room.wait and wait is not None:
            wait(rows)
            return [], None
        if room.end is not None:
            ended = next(s for s, _ in rows if s is room.end)
            rows = [r for r in rows if r[0] is not ended]
            out_of_cells(engine, ended)
        log.debug("shared KV pool full: freed %d idle cells, %d rows left", room.freed,
                  len(rows))
    return [], None


def out_of_cells(engine: resume.Engine, stream: Stream) -> None:
    """The shared pool has no cells for ``stream``: it ends as a full context ends it
    (paused to grow when the daemon allows it and it has written a token: runner/resume.py)."""
    log.info("request %s: the shared KV pool is full (it holds %d cells)", stream.rid,
             len(stream.state.tokens))
    stream.context_full, stream.next_token, stream.resume_next = True, None, None
    stream.todo.clear()
    if stream.spec.grow and stream.media is None and stream.written:
        resume.pause(engine, stream)
    else:
        engine.done(stream)

"""The runner's transport and lifetime: socket I/O, the serve loop, interrupts, parent watch.

Split from :mod:`modeld.runner.process` (which owns the model; it and the modules it drives
import llama_cpp) so that the rules of the conversation with the daemon live in one place: one
request at a time, in order; ``cancel``/``shutdown``/``memory`` handled between tokens; anything
else that arrives early queued; exit on ``shutdown`` or when the parent process dies. A
heartbeat thread (:func:`heartbeats`) tells the daemon the process is alive while the main
thread is inside llama.cpp (ctypes calls release the GIL), so a runner that stops answering
(SIGSTOP, a deadlock holding the GIL, a frozen host) is told apart from one evaluating a long
prompt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import zmq

from modeld.errors import ErrorCode, ModeldError
from modeld.wire import runnerwire as rp
from modeld.wire.protocol import ProtocolError

log = logging.getLogger("modeld.runner")

POLL_MS = 200  # idle poll period: also how often a dead parent is noticed


class Interrupted(Exception):
    """Raised between tokens when the current request must stop (cancel, shutdown, orphaned)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RunnerServer:
    """Serves runner-protocol messages on one DEALER socket; subclasses do the model work by
    implementing the ``handle_*`` methods (each replies with :meth:`send`)."""

    def __init__(self, sock: zmq.Socket[bytes], runner_id: str, parent_pid: int) -> None:
        self.sock = sock
        self.runner_id = runner_id
        self.parent_pid = parent_pid
        self.pending: deque[dict[str, Any]] = deque()
        self.stopping = False
        self._worked = False  # since the last on_idle()

    # ---------------------------------------------------------------- model work (subclass)

    def on_idle(self) -> None:
        """Called once when the runner has been idle for :data:`POLL_MS` after serving."""

    def handle_load(self, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    def handle_generate(self, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    def handle_embed(self, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    def handle_rerank(self, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    def handle_memory(self) -> None:
        raise NotImplementedError

    def handle_unload(self) -> None:
        raise NotImplementedError

    def handle_handoff(self, prefix: str) -> None:
        raise NotImplementedError

    # ---------------------------------------------------------------- I/O

    def send(self, msg: Mapping[str, Any]) -> None:
        self.sock.send_multipart(rp.encode(msg))

    def parent_alive(self) -> bool:
        return os.getppid() == self.parent_pid

    def _recv_nowait(self) -> dict[str, Any] | None:
        try:
            frames = self.sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return None
        try:
            return rp.decode(frames)
        except ProtocolError as exc:
            log.warning("dropping malformed message: %s", exc)
            self.send(rp.error(None, ErrorCode.INVALID_REQUEST, str(exc)))
            return None

    def check_interrupt(self, rid: str) -> None:
        """Between tokens: handle cancel/shutdown/memory now, queue anything else.

        Raises :class:`Interrupted` when request ``rid`` must stop.
        """
        if not self.parent_alive():
            self.stopping = True
            raise Interrupted("the daemon is gone")
        while self.sock.poll(0, zmq.POLLIN):
            msg = self._recv_nowait()
            if msg is None:
                continue
            kind = msg["type"]
            if kind == "cancel":
                if msg.get("rid") == rid:
                    raise Interrupted("cancelled")
                if not self._cancel_pending(msg.get("rid")):
                    log.debug("ignoring cancel for %r (serving %r)", msg.get("rid"), rid)
            elif kind == "shutdown":
                self.stopping = True
                raise Interrupted("the runner is shutting down")
            elif kind == "memory":
                self.handle_memory()
            else:
                self.pending.append(msg)

    def between_steps(self, active: set[str]) -> list[dict[str, Any]]:
        """Between decode steps of the generate requests ``active``: answer ``memory`` now,
        return what concerns them (``cancel``, new ``generate`` requests, and a ``stop`` with
        its reason on shutdown or when the daemon is gone), queue anything else."""
        out: list[dict[str, Any]] = []
        if not self.parent_alive():
            self.stopping = True
            return [{"type": "stop", "reason": "the daemon is gone"}]
        # A generate read in this same batch is active too: its cancel can arrive beside it
        # when one step outlasts its caller (issue 21: a retried request that timed out while
        # a long step ran had its cancel dropped here and ran to the end).
        known: set[object] = set(active)
        while self.sock.poll(0, zmq.POLLIN):
            msg = self._recv_nowait()
            if msg is None:
                continue
            kind = msg["type"]
            if kind == "generate":
                known.add(msg.get("rid"))
                out.append(msg)
            elif kind == "cancel":
                if msg.get("rid") in known:
                    out.append(msg)
                elif not self._cancel_pending(msg.get("rid")):
                    log.debug("ignoring cancel for %r (not running)", msg.get("rid"))
            elif kind == "shutdown":
                self.stopping = True
                out.append({"type": "stop", "reason": "the runner is shutting down"})
            elif kind == "memory":
                self.handle_memory()
            else:
                self.pending.append(msg)
        return out

    def _cancel_pending(self, rid: object) -> bool:
        """Cancel a request still waiting in :attr:`pending` (an embed or rerank read while
        another request ran): it is answered ``cancelled`` and never started."""
        for msg in self.pending:
            if msg.get("rid") == rid and msg["type"] in ("generate", "embed", "rerank"):
                self.pending.remove(msg)
                self.send(rp.error(str(rid), ErrorCode.CANCELLED, "cancelled before it started"))
                return True
        return False

    # ---------------------------------------------------------------- loop

    def serve(self, hello: Mapping[str, Any]) -> int:
        """Send ``hello``, then serve until shutdown or until the parent dies; the exit code."""
        self.send(hello)
        while not self.stopping:
            if self.pending:
                self.dispatch(self.pending.popleft())
                continue
            if not self.sock.poll(POLL_MS, zmq.POLLIN):
                if self._worked:
                    self._worked = False
                    self.on_idle()
                if not self.parent_alive():
                    log.warning("parent process %d is gone; exiting", self.parent_pid)
                    return 0
                continue
            msg = self._recv_nowait()
            if msg is not None:
                self.dispatch(msg)
                self._worked = True
        log.info("runner %s exiting", self.runner_id)
        return 0

    def dispatch(self, msg: dict[str, Any]) -> None:
        """Serve one message; every failure becomes a reply, never an exit."""
        kind = msg["type"]
        rid = msg.get("rid") if isinstance(msg.get("rid"), str) else None
        try:
            if kind == "load":
                self.handle_load(msg)
            elif kind == "generate":
                self.handle_generate(msg)
            elif kind == "embed":
                self.handle_embed(msg)
            elif kind == "rerank":
                self.handle_rerank(msg)
            elif kind == "memory":
                self.handle_memory()
            elif kind == "unload":
                self.handle_unload()
            elif kind == "handoff":
                self.handle_handoff(str(msg.get("prefix") or ""))
            elif kind == "shutdown":
                self.stopping = True
            elif kind == "cancel":
                log.debug("cancel for %r arrived after it finished; ignored", rid)
            else:
                raise ProtocolError(f"unknown runner message type {kind!r}")
        except ModeldError as exc:
            if kind == "load":
                self.send(rp.load_failed(exc.code, exc.message, exc.hint))
            else:
                self.send(rp.error(rid, exc.code, exc.message, exc.details, exc.hint))
        except Exception as exc:  # keep serving: one bad request must not kill the model
            log.exception("%s request failed", kind)
            text = f"{type(exc).__name__}: {exc}"
            if kind == "load":
                self.send(rp.load_failed(ErrorCode.INTERNAL, text))
            else:
                self.send(rp.error(rid, ErrorCode.INTERNAL, text))


@contextlib.contextmanager
def connect(endpoint: str, identity: str) -> Iterator[zmq.Socket[bytes]]:
    """A DEALER connected to the daemon's runner ROUTER, identified as ``identity``."""
    ctx = zmq.Context()
    sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity.encode("utf-8"))
    sock.setsockopt(zmq.LINGER, 2000)  # let the last reply reach the daemon before exit
    sock.setsockopt(zmq.MAXMSGSIZE, rp.MAX_RUNNER_MESSAGE_BYTES)
    sock.connect(endpoint)
    try:
        yield sock
    finally:
        sock.close()
        ctx.term()


@contextlib.contextmanager
def heartbeats(ctx: zmq.Context[Any], endpoint: str, runner_id: str,
               period_s: float = rp.HEARTBEAT_S) -> Iterator[None]:
    """Send ``heartbeat`` every ``period_s`` from a thread with its own socket (a zmq socket must
    not be shared between threads; the context is: a second one would cost two more threads
    and their buffers) until the block ends."""
    stop = threading.Event()
    sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, rp.heartbeat_identity(runner_id).encode("utf-8"))
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 4)  # a daemon that stops reading needs no backlog of these
    sock.connect(endpoint)
    frames = rp.encode(rp.heartbeat())

    def beat() -> None:
        while not stop.wait(period_s):
            with contextlib.suppress(zmq.ZMQError):
                sock.send_multipart(frames, zmq.NOBLOCK)

    with contextlib.suppress(zmq.ZMQError):
        sock.send_multipart(frames, zmq.NOBLOCK)
    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(period_s + 1.0)
        sock.close()

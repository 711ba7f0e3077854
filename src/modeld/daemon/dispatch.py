"""Dispatch: the loaded models' slots, their FIFO queues, and the requests their runners decode.

Each loaded (or loading) model has a :class:`Slot`: its runner, the requests that runner is
decoding now (up to the model's ``parallel``) and a FIFO queue. :meth:`Dispatch.pump` sends
queued requests on as sequences free up; :meth:`Dispatch.finish` is the one place a request
ends (its reply sent, its id released). Owned by the daemon's event loop (no locks).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, cast

from modeld import sizing
from modeld.cache.policy import CachePolicy, EntryState, EvictionReason, ModelKey
from modeld.config import Settings
from modeld.daemon import crashinfo, workercheck
from modeld.daemon.decisions import AnswerLoad, Reload
from modeld.daemon.growth import Growth
from modeld.daemon.jobs import Job, LoadAsked, Send, Slot, done_body, joined
from modeld.daemon.leases import RpcLeases, leased_error
from modeld.daemon.supervisor import RunnerHandle, Supervisor
from modeld.errors import (
    CancelledError,
    ContextExceededError,
    ModeldError,
    RpcWorkerError,
    RunnerCrashedError,
    format_bytes,
)
from modeld.model import ctx, placement
from modeld.rpc.endpoints import lost_workers
from modeld.wire import protocol, runnerwire
from modeld.wire.options import MAX_TOKENS
from modeld.wire.replies import DeviceShare

log = logging.getLogger("modeld.daemon")


class Dispatch:
    """The slots of loaded models and the open requests, by (client, request id)."""

    def __init__(
        self, settings: Settings, cache: CachePolicy, supervisor: Supervisor, send: Send
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.sup = supervisor
        self._send = send  # the daemon's socket: replies to clients
        self.slots: dict[ModelKey, Slot] = {}
        self.leases = RpcLeases()  # which runner holds which RPC worker
        self.jobs: dict[tuple[bytes, str], Job] = {}
        self.asked: dict[ModelKey, LoadAsked] = {}  # what ``load`` set, kept through reloads
        self.growth = Growth(settings, cache)  # a request that outgrew its context
        self._seq = 0
        # Usable CPUs (affinity, cgroup quota): read once, not on every request.
        self.cpu_threads = sizing.default_threads()

    # ------------------------------------------------------------------ queues

    def enqueue(self, slot: Slot, job: Job, *, front: bool = False) -> None:
        """Queue ``job`` on its model (``front``: a request that retries with a larger context)."""
        if front:
            slot.queue.appendleft(job)
        else:
            slot.queue.append(job)
        self.cache.enqueue(slot.key)

    def pump(self, slot: Slot) -> Iterator[Reload | AnswerLoad]:
        """Send queued requests of ``slot`` to its runner, FIFO, up to ``slot.parallel`` at
        once. A deterministic greedy request (``Job.alone``) waits for the runner to be free
        and has it to itself, unless the runner reports batching never changes greedy tokens.
        A request that needs a reload waits until nothing runs (a busy runner is never
        stopped): then the slot is yielded as a :class:`Reload`; a ``load`` request that
        reaches its ready model is yielded to be answered with its row."""
        entry = self.cache.get(slot.key)
        while (
            entry is not None
            and entry.state is EntryState.READY
            and slot.queue
            and len(slot.active) < max(1, slot.parallel)
            and self.slots.get(slot.key) is slot
        ):
            job = slot.queue[0]
            if not slot.batch_invariant and slot.active and (
                job.alone or any(j.alone for j in slot.active.values())
            ):
                return
            if self.needs_reload(slot, job, entry.n_ctx):
                if slot.active:
                    return
                verdict = self._workers_ready(slot, job)
                if verdict is False:
                    return  # the workers are being asked (off the loop); the tick pumps again
                if isinstance(verdict, ModeldError):
                    slot.queue.popleft()
                    self.cache.dequeue(slot.key)
                    self.finish(job, verdict)
                    continue
                yield Reload(slot)
                return
            slot.queue.popleft()
            self.cache.dequeue(slot.key)
            if job.kind == "load":
                self.remember(job)
                if job.pinned:
                    self.cache.set_pinned(slot.key, True)
                self.cache.touch(slot.key, job.keep_alive_s)
                yield AnswerLoad(job, slot)
                continue
            self.cache.acquire(slot.key)
            slot.last_client = job.client
            self._seq += 1
            job.runner_rid = f"q{self._seq}"
            slot.active[job.runner_rid] = job
            msg = dict(job.payload, rid=job.runner_rid, n_threads=self.threads_for_request())
            if job.kind == "generate" and msg.get("grow") is not False:
                msg["grow"] = reply_may_grow(msg) and entry.n_ctx < ctx.cap_at_training(
                    1 << 24, slot.info.context_length)
            if not self.sup.send(slot.runner_id, msg):
                log.warning("runner %s unreachable; treating it as crashed", slot.runner_id)

    def remember(self, job: Job) -> LoadAsked:
        """Keep what the ``load`` ``job`` set for its model (see :class:`LoadAsked`)."""
        asked = self.asked.setdefault(job.key, LoadAsked())
        asked.take(job)
        return asked

    def keep_alive_for(self, job: Job) -> float:
        """``job``'s keep-alive: its own, else what a ``load`` set, else the default."""
        if job.keep_alive_s is not None:
            return job.keep_alive_s
        asked = self.asked.get(job.key)
        if asked is not None and asked.keep_alive_s is not None:
            return asked.keep_alive_s
        return self.settings.keep_alive_s

    def _workers_ready(self, slot: Slot, job: Job) -> bool | ModeldError:
        """Before a reload onto other RPC workers unloads the working model: True when each
        new worker answered ``HELLO`` (:mod:`.workercheck`), False while they are being asked,
        else the error, which fails the request alone (the model stays loaded). A worker
        leased to another loaded model fails it at once."""
        if not job.rpc or job.rpc == slot.rpc:
            return True
        for lease in self.leases.held(job.rpc):
            other = self.slot_of(lease.runner_id)
            if lease.runner_id != slot.runner_id and other is not None:
                return leased_error(lease, slot.name)
        if job.rpc_check is None:
            job.rpc_check = workercheck.start(job.rpc, serving=slot.rpc)
        if not job.rpc_check.done():
            return False
        err = job.rpc_check.exception()
        return err if isinstance(err, ModeldError) else True

    def checked_workers(self, slot: Slot) -> bool:
        """Whether the request first in ``slot``'s queue waits on a finished worker check (the
        tick then pumps the slot)."""
        check = slot.queue[0].rpc_check if slot.queue else None
        return check is not None and check.done() and not slot.active

    @staticmethod
    def needs_reload(slot: Slot, job: Job, n_ctx: int) -> bool:
        """A larger context, or (an explicit ``load``) another ``parallel`` or KV layout
        than loaded."""
        if job.n_ctx is not None and ctx.cap_at_training(
                job.n_ctx, slot.info.context_length) > n_ctx:
            return True  # a larger context (never past training: that one would loop)
        if job.kind == "load" and job.rpc is not None and job.rpc != slot.rpc:
            return True  # other RPC workers (or the first ones) than it was loaded with
        if job.kind == "load" and job.kv_cache_type not in (None, slot.kv_type):
            return True  # another KV cache type
        if slot.placement.wants_reload(job.gpu_layers):
            return True  # other GPU layers asked than loaded with (num_gpu, --gpu-layers)
        if job.kind == "load" and job.kv_unified not in (None, slot.kv_unified) and (
                job.parallel or slot.parallel) > 1:
            return True  # the other KV layout (one pool shared, or a stream per sequence)
        if job.kind == "load" and job.mmproj not in (None, slot.mmproj or ""):
            return True  # another image projector (or none) than loaded with
        return (
            job.kind == "load"
            and job.parallel is not None
            and job.parallel not in (slot.asked_parallel, slot.planned_parallel)
        )

    def threads_for_request(self) -> int:
        """CPU threads for a request about to start: the configured count, else the usable
        CPUs shared among the runners generating right now (this one included; a runner's
        sequences share its decode calls, so they count once)."""
        if self.settings.threads:
            return self.settings.threads
        active = max(1, sum(1 for s in self.slots.values() if s.active))
        return max(1, self.cpu_threads // active)

    def load_threads(self) -> int:
        """CPU threads a runner loads (and warms up) with."""
        return self.settings.threads or self.cpu_threads

    # ------------------------------------------------------------------ runner replies

    def finish(self, job: Job, result: ModeldError | protocol.Message) -> None:
        """End ``job``: its id is free again and its client gets ``result`` (if still there)."""
        if self.jobs.get((job.client, job.rid)) is job:
            del self.jobs[(job.client, job.rid)]
        msg = result if isinstance(result, protocol.Message) else protocol.error_reply(
            job.rid, result
        )
        if not job.client_gone:
            self._send(job, msg)

    def loaded(self, slot: Slot, runner: RunnerHandle, msg: dict[str, Any], now: float) -> bool:
        """The runner loaded ``slot``'s model: charge what it measured (plus the prompt cache
        it fills later), take its ``parallel``; False when the entry is gone meanwhile."""
        memory = msg.get("memory") if isinstance(msg.get("memory"), dict) else {}
        footprint = msg.get("footprint") if isinstance(msg.get("footprint"), dict) else {}
        measured: int | None = None
        if isinstance(memory, dict) and isinstance(memory.get("rss"), int):
            measured = int(memory["rss"])
        elif isinstance(footprint, dict) and isinstance(footprint.get("rss"), int):
            measured = int(footprint["rss"]) + int(runner.baseline.get("rss", 0))
        if measured is not None:
            # The prompt-state cache fills after load, up to its size: keep it reserved, so
            # the load-time RSS does not under-charge the runner (later peaks only add).
            measured += sizing.prompt_cache_bytes(slot.key.mode, self.settings,
                                                  self.cache.budget_bytes)
        n_ctx = msg.get("n_ctx")
        entry = self.cache.get(slot.key)
        if entry is None:
            return False
        parallel = msg.get("parallel")  # absent: a runner that decodes one sequence
        slot.parallel = parallel if isinstance(parallel, int) and parallel >= 1 else 1
        slot.batch_invariant = msg.get("greedy_batch_invariant") is True
        slot.kv_unified = msg.get("kv_unified") is True
        devices = msg.get("devices")
        if isinstance(devices, list):
            slot.devices = [cast(DeviceShare, d) for d in devices if isinstance(d, dict)]
        layers = msg.get("layers_offloaded")
        slot.layers_offloaded = layers if isinstance(layers, str) else None
        gpu = memory.get("gpu") if isinstance(memory, dict) else None
        slot.vram_measured = gpu if isinstance(gpu, int) else None
        load_s = now - slot.load_started
        if slot.rpc and isinstance(n_ctx, int) and n_ctx < entry.n_ctx:
            entry.ctx_reason = (
                f"lowered from {entry.n_ctx} so every rpc worker's share fits its memory"
            )
        self.cache.load_succeeded(
            slot.key, measured, int(n_ctx) if isinstance(n_ctx, int) else entry.n_ctx, load_s,
            None if slot.vram_measured is None
            else placement.split_like(slot.vram_measured, slot.placement.vram),
        )
        log.info(
            "loaded %s in %.2f s: n_ctx %d, parallel %d, measured %s (estimate %s)%s",
            slot.name, load_s, entry.n_ctx, slot.parallel, format_bytes(measured or 0),
            format_bytes(entry.estimate_bytes),
            "".join(f", {d.get('device')} {format_bytes(int(d.get('model_bytes') or 0))}"
                    for d in slot.devices),
        )  # fmt: skip
        return True

    def load_failed(self, slot: Slot, err: ModeldError) -> None:
        """The load of ``slot`` failed: its queue fails with ``err`` and its runner stops."""
        log.warning("loading %s failed: %s", slot.name, err)
        # A runner still running may hold the model's memory until it exits (a timed-out
        # load goes on reading it): keep that charged so nothing is admitted on it meanwhile.
        alive = slot.runner_id in self.sup.runners
        self.cache.load_failed(slot.key, err.message, err.code.value, runner_alive=alive)
        self.slots.pop(slot.key, None)
        self.sup.stop(slot.runner_id)
        for job in slot.queue:
            self.finish(job, err)
        slot.queue.clear()

    def done(self, slot: Slot, job: Job, msg: dict[str, Any], now: float,
             baseline: int = 0) -> None:
        """The runner finished ``job``: count its tokens and the runner's peak memory, free
        its sequence and reply with the ``done`` body; a reply that stopped for a larger
        context (``resume``) is queued again first instead (sized with ``baseline``)."""
        if job.counting is not None:  # its exact count: grow for it, or refuse (growth.py)
            self.failed(slot, job, self.growth.counted(job, msg), baseline)
            return
        entry = self.cache.get(slot.key)
        resume = msg.get("resume")
        if isinstance(resume, list) and resume and entry is not None and not job.cancel_sent:
            self._note_peak_memory(slot, msg.get("memory"))
            self.release(slot, job)
            self.growth.for_reply(slot, job, msg, resume, entry.n_ctx, baseline)
            self.enqueue(slot, job, front=True)
            return
        if job.earlier is not None:
            msg = joined(job.earlier, msg)
        body = done_body(slot, job, entry, msg, now)
        usage, times = body["usage"], msg.get("timings")
        drafts = times if isinstance(times, dict) else {}
        self.cache.record_tokens(
            int(usage.get("completion_tokens", 0)), int(usage.get("prompt_tokens", 0)),
            drafted=int(drafts.get("draft_tokens", 0)),
            accepted=int(drafts.get("draft_accepted", 0)),
        )
        self._note_peak_memory(slot, msg.get("memory"))
        self.release(slot, job)
        self.finish(job, protocol.done(job.rid, **body))

    def _note_peak_memory(self, slot: Slot, memory: object) -> None:
        """Account the runner's peak RSS: a model grows after load (its compute buffers and
        KV pages are touched by the first full batches), so the load-time figure under-counts."""
        entry = self.cache.get(slot.key)
        if entry is None or not isinstance(memory, dict) or not isinstance(memory.get("rss"), int):
            return
        peak = max(int(memory["rss"]), entry.measured_bytes or 0)
        if peak != entry.measured_bytes:
            self.cache.update_measured(slot.key, peak)

    def failed(self, slot: Slot, job: Job, err: ModeldError, baseline: int) -> None:
        """The runner ended ``job`` with ``err``: a prompt over the context is queued again
        first with a larger one (sized with the runner ``baseline``) when that can fit; a
        cancelled request ends as cancelled whatever the runner said."""
        self.release(slot, job)
        if isinstance(err, ContextExceededError) and not job.cancel_sent:
            grown = self.growth.for_prompt(slot, job, err, baseline)
            if grown is True:
                self.enqueue(slot, job, front=True)
                return
            if grown is not False:
                err = grown  # no larger context fits: that says why
        if job.cancel_sent and not isinstance(err, CancelledError):
            err = CancelledError("request cancelled")
        self.finish(job, err)

    def reply_error(self, job: Job, err: ModeldError) -> None:
        """Refuse a request that was never accepted (its id stays with the request using it)."""
        self._send(job, protocol.error_reply(job.rid, err))

    def release(self, slot: Slot, job: Job) -> None:
        """One sequence ended; the keep-alive clock starts when the last one has."""
        slot.active.pop(job.runner_rid, None)
        if self.cache.get(slot.key) is not None:
            self.cache.release(slot.key, self.keep_alive_for(job))

    def cancel(self, job: Job) -> bool:
        """Cancel ``job`` where it is: True when its runner decodes it (the runner ends it and
        its reply follows); when only queued it is taken off the queue (False: not ended yet)."""
        slot = self.slots.get(job.key)
        if slot is not None and slot.active.get(job.runner_rid) is job:
            if not job.cancel_sent:
                job.cancel_sent = True
                self.sup.send(slot.runner_id, runnerwire.cancel(job.runner_rid))
            return True
        if slot is not None and job in slot.queue:
            slot.queue.remove(job)
            self.cache.dequeue(job.key)
        return False

    def runner_lost(self, slot: Slot, runner: RunnerHandle) -> list[Job]:
        """The runner of ``slot`` is gone: a load fails (with a cool-down unless it was killed
        for silence); a loaded model is dropped and its requests fail. Returns its queue, for
        the scheduler to route again."""
        entry = self.cache.get(slot.key)
        why = f"runner {runner.id} (pid {runner.pid}) exited with code {runner.exit_code}"
        if runner.stalled_s is not None:
            why = (
                f"runner {runner.id} (pid {runner.pid}) stopped answering for "
                f"{runner.stalled_s:.0f} s (stopped, or stuck) and was killed"
            )
        if slot.rpc_stalled_s is not None:
            self._worker_lost(slot, runner, list(slot.rpc), "stalled", (
                f"rpc worker {', '.join(slot.rpc)} stopped answering: {slot.name} made no "
                f"progress for {slot.rpc_stalled_s:.0f} s and its runner was killed"))
            return []
        lost = lost_workers(slot.rpc) if slot.rpc and runner.stalled_s is None else []
        if lost:
            self._worker_lost(slot, runner, lost, "lost",
                              f"rpc worker {', '.join(lost)} lost: {slot.name}'s runner ended "
                              f"({why})")  # fmt: skip
            return []
        if entry is not None and entry.state is EntryState.LOADING and runner.stalled_s:
            self.load_failed(
                slot,
                RunnerCrashedError(
                    f"loading {slot.name} failed: {why}",
                    hint="retry; if it happens again see the runner log, or raise "
                    "runner_stall_s if this machine pauses processes that long",
                    details={"stalled_s": runner.stalled_s, "path": slot.key.path},
                ),
            )
            self.cache.clear_failure(slot.key)  # not the file's fault: no cool-down
            return []
        if entry is not None and entry.state is EntryState.LOADING:
            err = crashinfo.load_crash(slot.name, slot.key.path, runner.exit_code,
                                       runner.devices, crashinfo.tail(runner.load_log),
                                       runner.load_log)  # fmt: skip
            log.warning("%s", err.message)
            self.load_failed(slot, err)
            return []
        log.warning("%s: %s", slot.name, why)
        self.slots.pop(slot.key, None)
        if entry is not None:
            self.cache.remove(slot.key, EvictionReason.CRASH)
        for job in list(slot.active.values()):
            self.finish(
                job,
                RunnerCrashedError(
                    f"the runner of {slot.name} crashed: {why}",
                    hint="retry; the model is loaded again on the next request"
                    + ("" if runner.stalled_s is None else
                       " (a runner silent for runner_stall_s is killed: raise it if "
                       "this machine pauses processes that long)"),
                    details={"exit_code": runner.exit_code, "stalled_s": runner.stalled_s},
                ),
            )  # fmt: skip
        slot.active.clear()
        requeue = list(slot.queue)
        slot.queue.clear()
        return requeue

    def _worker_lost(
        self, slot: Slot, runner: RunnerHandle, lost: list[str], problem: str, message: str
    ) -> None:
        """The runner of a model on RPC workers ended because of them: ``lost`` no longer
        accept a connection, or (``stalled``) stopped answering. Its load or its requests
        (queued ones too: they would load on the same workers) fail with ``rpc_worker`` naming
        them; the model is dropped (no cool-down: the file is fine) and loads again on the next
        request."""
        err = RpcWorkerError(
            message,
            hint="restart the worker (modeld rpc-worker) and retry; the model loads again on "
            "the next request",
            details={"endpoint": lost[0], "endpoints": lost, "problem": problem,
                     "exit_code": runner.exit_code},
        )  # fmt: skip
        log.warning("%s", err.message)
        entry = self.cache.get(slot.key)
        if entry is not None and entry.state is EntryState.LOADING:
            self.load_failed(slot, err)
            self.cache.clear_failure(slot.key)
            return
        self.slots.pop(slot.key, None)
        if entry is not None:
            self.cache.remove(slot.key, EvictionReason.CRASH)
        for job in [*slot.active.values(), *slot.queue]:
            self.finish(job, err)
        slot.active.clear()
        slot.queue.clear()

    # ------------------------------------------------------------------ lookups

    def stalled_on_rpc(self, now: float) -> list[str]:
        """The runners on RPC workers whose requests made no progress for ``runner_stall_s``
        (to be killed): a worker stopped answering without closing its connection (its host
        hung, or it was stopped), and llama.cpp waits for it forever while the runner's
        heartbeat goes on. Their requests then fail with ``rpc_worker`` (:meth:`runner_lost`)."""
        stalled = []
        for slot in self.slots.values():
            if not slot.active:
                slot.busy_since = None
                continue
            if slot.busy_since is None:
                slot.busy_since = now
            if not slot.rpc or slot.rpc_stalled_s is not None:
                continue
            silent = now - max(slot.progress_at, slot.busy_since)
            if silent > self.settings.runner_stall_s:
                slot.rpc_stalled_s = silent
                log.error("%s made no progress on rpc workers %s for %.1f s: killing runner %s",
                          slot.name, ",".join(slot.rpc), silent, slot.runner_id)  # fmt: skip
                stalled.append(slot.runner_id)
        return stalled

    def slot_of(self, runner_id: str) -> Slot | None:
        for slot in self.slots.values():
            if slot.runner_id == runner_id:
                return slot
        return None

    def idle(self, slot: Slot) -> bool:
        entry = self.cache.get(slot.key)
        return (
            entry is not None
            and entry.state is EntryState.READY
            and not slot.active
            and not slot.queue
            and entry.in_flight == 0
        )

    def queued(self) -> int:
        return sum(len(s.queue) for s in self.slots.values())


def reply_may_grow(msg: dict[str, Any]) -> bool:
    """Whether a reply that reaches the end of its context may go on in a larger one: only
    when the request set an output limit. Without one (Codex sends none) it ends there, with
    finish ``length``, as Ollama ends a reply without ``num_predict`` at its context's end;
    before, such a reply (a model repeating one line) grew the context again and again."""
    limit = msg.get("max_tokens")
    return isinstance(limit, int) and limit < MAX_TOKENS

"""Request scheduling: which runner serves which request, when models load, wait and leave.

Owned and called only by the daemon's event loop (single-threaded, so no locks). It joins the
pure cache policy (:mod:`modeld.cache.policy`) to real runner processes
(:mod:`modeld.daemon.supervisor`) through three parts that own their state: the runner pool
(:mod:`.pool`: spare, reuse, baseline), admission (:mod:`.admission`: sizing, waiting, retry)
and dispatch (:mod:`.dispatch`: slots, queues, sending, endings). Requests for one model queue
FIFO on its slot; different models run in parallel; requests for a model that is loading join
that load; a model that does not fit waits (bounded) for busy ones or is refused at once with
the numbers. The :class:`Scheduler` routes requests and reacts to events: runner messages and
exits, client cancels, vanished clients, explicit unloads and the timer.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from modeld import paths
from modeld.cache.policy import CachePolicy, EntryState, EvictionReason, ModelKey
from modeld.config import Settings
from modeld.daemon import workercheck
from modeld.daemon.admission import Admission, rpc_of
from modeld.daemon.decisions import AnswerLoad, Decision, Evict, Pump, Reload, StartLoad
from modeld.daemon.dispatch import Dispatch
from modeld.daemon.jobs import Job, Send, Slot, Waiting, ps_rows
from modeld.daemon.pool import RunnerPool
from modeld.daemon.supervisor import RunnerHandle, Supervisor
from modeld.errors import (
    CancelledError,
    ErrorCode,
    RequestTimeoutError,
    ShuttingDownError,
    error_from_dict,
    format_bytes,
)
from modeld.model.modelinfo import ModelInfo
from modeld.wire import protocol, runnerwire
from modeld.wire.replies import PsRow, UnloadedRow

log = logging.getLogger("modeld.daemon")
#: The advice a full queue gives (HTTP ``Retry-After``): about one short generation's time.
QUEUE_FULL_RETRY_S = 2


class Scheduler:
    """All model and request state of the daemon, in its three parts; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        cache: CachePolicy,
        supervisor: Supervisor,
        send: Send,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.sup = supervisor
        self._send = send
        self._clock = clock
        self.pool = RunnerPool(settings, cache, supervisor, clock)
        self.dispatch = Dispatch(settings, cache, supervisor, send)
        self.admission = Admission(settings, cache, self.pool, self.dispatch, clock)
        self.dispatch.growth.where_of = self.admission.where
        self.stopping = False
        self.prechecks = workercheck.Prechecks()  # loads onto RPC workers, asked HELLO first
        self._last_file_check = 0.0
        # Evicted models' prompt snapshots are kept on disk here (off with the prompt cache).
        self.prompt_cache_dir: str | None = (
            str(paths.prompt_cache_dir()) if settings.prompt_cache_mib != 0 else None
        )
        # a reload's handoff (runner/handoff.py): the file prefix and the old runner's pid
        self.handoffs: dict[ModelKey, tuple[str, int]] = {}

    # ------------------------------------------------------------------ the parts' state

    @property
    def slots(self) -> dict[ModelKey, Slot]:
        return self.dispatch.slots

    @property
    def jobs(self) -> dict[tuple[bytes, str], Job]:
        return self.dispatch.jobs

    @property
    def waiting(self) -> dict[ModelKey, Waiting]:
        return self.admission.waiting

    @property
    def baseline(self) -> int:
        return self.pool.baseline

    @property
    def spare(self) -> str | None:
        return self.pool.spare

    def model_info(self, key: ModelKey) -> ModelInfo:
        return self.admission.model_info(key)

    def ensure_spare(self) -> None:
        loading = any(e.state is EntryState.LOADING for e in self.cache.entries())
        self.pool.ensure_spare(loading)

    # ------------------------------------------------------------------ intake

    def submit(self, job: Job) -> None:
        """Route a new request: queue on its model, join a load or wait, or fail at once."""
        ident = (job.client, job.rid)
        if ident in self.jobs:
            self.dispatch.reply_error(
                job, protocol.ProtocolError(f"request id {job.rid!r} is in use")
            )
            return
        queued = self.dispatch.queued() + self.admission.queued() + len(self.prechecks.jobs)
        if queued >= self.settings.max_queue:
            self.dispatch.reply_error(
                job,
                RequestTimeoutError(
                    f"{queued} requests are already queued",
                    hint=f"retry in {QUEUE_FULL_RETRY_S} s or raise max_queue",
                    details={"queued": queued, "retry_after_s": QUEUE_FULL_RETRY_S},
                ),
            )
            return
        job.created = self._clock()
        self.jobs[ident] = job
        self.cache.record_request()
        self._retire_stale(job.key)
        self._route(job)

    def _route(self, job: Job) -> None:
        slot = self.slots.get(job.key)
        if slot is not None and not slot.draining:
            entry = self.cache.get(job.key)
            if entry is not None and entry.state is EntryState.READY:
                self.cache.record_hit()
            else:
                self.cache.record_miss()
                job.waited_for_load = True
            self.dispatch.enqueue(slot, job)
            self._pump(slot)
            return
        if job.rpc and slot is None and not self.admission.leases.held(job.rpc) \
                and self.prechecks.hold(job):
            return  # its workers are asked HELLO first; the tick routes it again
        self.cache.record_miss()
        job.waited_for_load = True
        if not self.admission.join(job, draining=slot is not None):
            self.carry_out(self.admission.admit(job.key, job.name, [job], None))

    def _retire_stale(self, key: ModelKey) -> None:
        """Older versions of a file that changed on disk go once idle."""
        for slot in self.slots.values():
            if slot.key != key and slot.key.path == key.path and slot.key.mode == key.mode:
                slot.retire = EvictionReason.FILE_CHANGED

    # ------------------------------------------------------------------ loads and evictions

    def carry_out(self, decisions: Iterable[Decision]) -> None:
        """Do what admission or dispatch decided, each before the part plans its next."""
        for decision in decisions:
            match decision:
                case StartLoad():
                    self._start_load(decision)
                case Evict(key=key, reason=reason):
                    self.evict(key, reason)
                case Reload(slot=slot):
                    self._reload(slot)
                case AnswerLoad(job=job, slot=slot):
                    self.dispatch.finish(job, protocol.done(job.rid, model=self.row(slot.key)))
                case Pump(slot=slot):
                    self._pump(slot)

    def _pump(self, slot: Slot) -> None:
        self.carry_out(self.dispatch.pump(slot))

    def _retry(self) -> None:
        self.carry_out(self.admission.retry())

    def _start_load(self, load: StartLoad) -> None:
        """Admission said yes: a runner loads the model and its jobs queue on its new slot."""
        key, name, jobs, info, size = load.key, load.name, load.jobs, load.info, load.size
        rpc = rpc_of(jobs) or ()
        runner = self.pool.take(fork=not rpc)
        if rpc:
            self.admission.leases.take(rpc, runner.id, name)
        for job in jobs:
            if job.kind == "load":
                self.dispatch.remember(job)
        asked = self.dispatch.asked.get(key)
        self.cache.begin_load(
            key, size.need_bytes, size.n_ctx, size.reason, runner.id,
            pinned=any(j.pinned for j in jobs) or (asked is not None and asked.pinned),
            keep_alive_s=self.dispatch.keep_alive_for(
                next((j for j in jobs if j.keep_alive_s is not None), jobs[0])),
            vram=size.placement.vram, gpu_layers=size.placement.gpu_layers,
        )  # fmt: skip
        slot = Slot(key, name, runner.id, info, runner_pid=runner.pid)
        slot.load_started = self._clock()
        slot.parallel = slot.planned_parallel = size.parallel
        slot.parallel_reason = size.parallel_reason
        slot.kv_unified = size.kv_unified  # planned; the runner's ``loaded`` says what it did
        slot.asked_parallel = asked.parallel if asked is not None else None
        slot.asked_kv_type = asked.kv_cache_type if asked is not None else None
        slot.kv_type, slot.placement = size.kv_type, size.placement
        slot.vram_estimate = size.vram_bytes
        slot.rpc = rpc
        slot.mmproj = load.mmproj
        self.slots[key] = slot
        for job in jobs:
            self.dispatch.enqueue(slot, job)
        log.info(
            "loading %s in runner %s: n_ctx %d (%s), parallel %d (%s%s), estimate %s, KV %s, "
            "%d GPU layers (%s)%s",
            name, runner.id, size.n_ctx, size.reason, size.parallel, size.parallel_reason,
            "; one pool of n_ctx cells shared" if size.kv_unified else "",
            format_bytes(size.need_bytes), size.kv_type, size.placement.gpu_layers,
            size.placement.reason, f", rpc workers {','.join(rpc)}" if rpc else "",
        )  # fmt: skip
        msg = runnerwire.load(
            key.path, mode=key.mode, n_ctx=size.n_ctx, n_threads=self.dispatch.load_threads(),
            seed=0, prompt_cache_mib=size.prompt_cache_bytes >> 20,
            # a waiting request is the warm-up: a separate one would only delay it
            warm_up=not any(j.kind != "load" for j in jobs),
            prompt_cache_dir=self.prompt_cache_dir, parallel=size.parallel, rpc=rpc,
            kv_unified=size.kv_unified,
            gpu_layers=size.placement.gpu_layers, tensor_split=size.placement.tensor_split,
            type_k=size.kv_type, type_v=size.kv_type, mmproj=load.mmproj,
            **self.admission.rpc_sizing(jobs, size.n_ctx), **self._handoff_for(key, rpc),
        )  # fmt: skip
        self.sup.send(runner.id, msg)

    def _reload(self, slot: Slot) -> None:
        """Reload an idle entry (a larger context, another ``parallel``) for the jobs queued;
        its runner first writes its sequences' cells for the next one (runner/handoff.py)."""
        jobs = list(slot.queue)
        slot.queue.clear()
        runner = self.sup.runners.get(slot.runner_id)
        if self.prompt_cache_dir is not None and not slot.rpc and runner is not None:
            prefix = os.path.join(self.prompt_cache_dir, f"handoff-{slot.runner_id}-"
                                  f"{uuid.uuid4().hex[:12]}")  # fmt: skip
            if self.sup.send(slot.runner_id, runnerwire.handoff(prefix)):
                self.handoffs[slot.key] = (prefix, runner.pid)
        for job in jobs:
            self.cache.dequeue(slot.key)
            job.waited_for_load = True  # its load_s is this reload's (it said 0 for 8 s)
        self.evict(slot.key, EvictionReason.RELOAD)
        self.carry_out(self.admission.requeue(slot.key, slot.name, jobs))

    def _handoff_for(self, key: ModelKey, rpc: tuple[str, ...]) -> dict[str, Any]:
        """The ``load`` fields that take over a reload's handoff for ``key`` (if one waits)."""
        prefix, pid = self.handoffs.pop(key, ("", 0))
        return {"handoff": prefix, "handoff_pid": pid} if prefix and not rpc else {}

    def evict(self, key: ModelKey, reason: EvictionReason) -> None:
        """Take ``key`` out of service; its memory is freed when its runner has exited. What
        a ``load`` set for it is forgotten, unless it is reloading."""
        slot = self.slots.pop(key, None)
        if reason is not EvictionReason.RELOAD:
            self.dispatch.asked.pop(key, None)
        if self.cache.get(key) is not None:
            self.cache.begin_unload(key, reason)
        if slot is not None:
            log.info("unloading %s (%s)", slot.name, reason.value)
            # a runner that registered RPC workers cannot drop them: it exits, never reused
            self.pool.retire(slot.runner_id, reusable=not slot.rpc)

    def _rebalance(self) -> None:
        plan = self.cache.rebalance()
        if plan is not None and plan.action == "evict":
            for victim in plan.victims:
                self.evict(victim, plan.victim_reason(victim))

    def unload(self, keys: list[ModelKey]) -> tuple[list[str], list[str]]:
        """Explicit unload: idle ones now, busy ones when their requests finish."""
        now_names: list[str] = []
        later: list[str] = []
        for key in keys:
            slot = self.slots.get(key)
            if slot is None:
                continue
            if self.cache.get(key) is not None:
                self.cache.set_pinned(key, False)
            if self.dispatch.idle(slot):
                self.evict(key, EvictionReason.EXPLICIT)
                now_names.append(slot.name)
            else:
                slot.retire = EvictionReason.EXPLICIT
                later.append(slot.name)
        return now_names, later

    def shutdown(self) -> None:
        """Fail every open request with ``shutting_down`` (runners are stopped by the daemon)."""
        self.stopping = self.pool.stopping = True
        for job in list(self.jobs.values()):
            self.dispatch.finish(
                job,
                ShuttingDownError(
                    "the daemon is shutting down", hint="start it again with modeld serve"
                ),
            )
        for key in list(self.slots):
            if self.cache.get(key) is not None:
                self.cache.begin_unload(key, EvictionReason.SHUTDOWN)
        self.slots.clear()
        self.waiting.clear()

    # ------------------------------------------------------------------ runner events

    def on_runner_message(self, runner: RunnerHandle, msg: dict[str, Any]) -> None:
        mtype = msg["type"]
        if mtype == "hello":
            self.pool.on_hello(runner)
            if self.waiting:
                self._retry()  # loads held back to be sized with a measured baseline
            return
        if mtype == "unloaded":
            reusable = self.pool.on_unloaded(runner, msg)
            self._retry()  # its memory may be what a waiting load needs (takes the spare)
            if reusable:
                self.pool.adopt(runner)  # ... and this runner takes the spare's place
            return
        slot = self.dispatch.slot_of(runner.id)
        if slot is not None:
            slot.progress_at = self._clock()
        if slot is None:
            if mtype not in ("memory", "error"):
                log.debug("ignoring %s from runner %s without a model", mtype, runner.id)
            return
        if mtype == "loaded":
            self._on_loaded(slot, runner, msg)
        elif mtype == "load_failed":
            err = error_from_dict(msg)
            self.dispatch.load_failed(slot, err)
            if err.code is ErrorCode.RPC_WORKER:
                self.cache.clear_failure(slot.key)  # a worker's fault, not the file's
        elif mtype in ("chunk", "done", "error"):
            rid = msg.get("rid")
            job = slot.active.get(rid) if isinstance(rid, str) else None
            if job is None:
                log.debug("stale %s from runner %s", mtype, runner.id)
                return
            if mtype == "chunk":
                text = msg.get("text")
                if isinstance(text, str) and not job.client_gone:
                    parts = {k: msg[k] for k in protocol.CHUNK_PARTS if msg.get(k)}
                    self._deliver(job, protocol.chunk(job.rid, text, **parts))
            elif mtype == "done":
                self._on_done(slot, job, msg)
            else:
                self._on_error(slot, job, msg)
        elif mtype == "memory":
            footprint = msg.get("memory")
            if isinstance(footprint, dict) and isinstance(footprint.get("rss"), int):
                self.cache.update_measured(slot.key, int(footprint["rss"]))

    def _on_loaded(self, slot: Slot, runner: RunnerHandle, msg: dict[str, Any]) -> None:
        if self.dispatch.loaded(slot, runner, msg, self._clock()):
            self._rebalance()
            self._pump(slot)

    def _on_done(self, slot: Slot, job: Job, msg: dict[str, Any]) -> None:
        self.dispatch.done(slot, job, msg, self._clock(), self.baseline)
        self._after_release(slot)
        self._rebalance()

    def _on_error(self, slot: Slot, job: Job, msg: dict[str, Any]) -> None:
        self.dispatch.failed(slot, job, error_from_dict(msg), self.baseline)
        self._after_release(slot)

    def _after_release(self, slot: Slot) -> None:
        self._pump(slot)
        self.expire()
        self._retry()

    def on_runner_exit(self, runner: RunnerHandle) -> None:
        """A runner process ended: free its memory; fail or re-route its requests."""
        self.pool.on_exit(runner)
        self.cache.unload_finished(runner.id)
        slot = self.dispatch.slot_of(runner.id)
        if slot is not None:
            for job in self.dispatch.runner_lost(slot, runner):
                self._route(job)
        freed = self.admission.leases.release(runner.id)
        if freed:
            log.info("rpc workers %s are free again (runner %s exited)", ",".join(freed), runner.id)
        self._retry()

    # ------------------------------------------------------------------ client events

    def cancel(self, client: bytes, target: str) -> bool:
        job = self.jobs.get((client, target))
        if job is None:
            return False
        self._cancel_job(job)
        return True

    def client_gone(self, client: bytes) -> None:
        """The client vanished: cancel all of its requests quietly."""
        for job in [j for j in self.jobs.values() if j.client == client]:
            job.client_gone = True
            self._cancel_job(job)

    def _cancel_job(self, job: Job) -> None:
        if self.dispatch.cancel(job):
            return  # its runner ends it; the reply follows
        self.admission.remove(job)
        self.dispatch.finish(job, CancelledError("request cancelled"))

    def _deliver(self, job: Job, msg: protocol.Message) -> None:
        if job.client_gone:
            return
        if not self._send(job, msg):
            log.info("client of %s went away; cancelling", job.rid)
            self.client_gone(job.client)

    # ------------------------------------------------------------------ timers

    def tick(self) -> None:
        """Periodic work: stalled and dead runners, keep-alive, retirements, waits, load
        timeouts."""
        self.sup.kill_stalled(self.settings.runner_stall_s)
        for runner_id in self.dispatch.stalled_on_rpc(self._clock()):
            self.sup.kill(runner_id)
        for runner in self.sup.reap():
            self.on_runner_exit(runner)
        self.expire()
        self.prechecks.settle(self.jobs, self._route, self.dispatch.finish)
        now = self._clock()
        if now - self._last_file_check > 1.0:
            self._last_file_check = now
            for slot in list(self.slots.values()):
                if slot.retire is None and not slot.key.is_current():
                    slot.retire = EvictionReason.FILE_CHANGED
        for slot in list(self.slots.values()):
            entry = self.cache.get(slot.key)
            if entry is None:
                continue
            if self.dispatch.checked_workers(slot):
                self._pump(slot)  # its RPC workers answered (or failed) their HELLO
                continue
            if slot.retire is not None and self.dispatch.idle(slot):
                self.evict(slot.key, slot.retire)
            elif entry.state is EntryState.LOADING and (
                now - slot.load_started > self.settings.load_timeout_s
            ):
                self.sup.stop(slot.runner_id)
                self.dispatch.load_failed(
                    slot,
                    RequestTimeoutError(
                        f"loading {slot.name} took longer than {self.settings.load_timeout_s:g} s",
                        hint="raise load_timeout_s or check the runner log",
                    ),
                )
        self.admission.time_out(now)
        self._retry()
        self.ensure_spare()
        self.sup.stop_idle_fork_server(self.settings.runner_fork_idle_s)

    def expire(self) -> None:
        """Evict the idle models whose keep-alive ran out."""
        for entry in self.cache.expired():
            slot = self.slots.get(entry.key)
            if slot is None or self.dispatch.idle(slot):
                self.evict(entry.key, EvictionReason.KEEP_ALIVE)

    def forget_failure(self, key: ModelKey) -> None:
        self.cache.clear_failure(key)

    def ps_rows(self) -> list[PsRow]:
        return ps_rows(self.cache, self.slots, self.waiting, self.sup.runners, self._clock())

    def row(self, key: ModelKey) -> PsRow | UnloadedRow:
        """The ``ps`` row of ``key`` (what a ``load`` reply carries)."""
        for r in self.ps_rows():
            if r["path"] == key.path and r["mode"] == key.mode and r["state"] != "waiting":
                return r
        return {"path": key.path, "mode": key.mode, "state": "unloaded"}

"""Request scheduling core: which runner serves which request, when models load and leave.

Owned and called only by the daemon's event loop (single-threaded, so no locks). It joins the
pure cache policy (:mod:`modeld.cache.policy`) to real runner processes
(:mod:`modeld.daemon.supervisor`):
requests for one model queue FIFO on its :class:`Slot`; different models run in parallel;
requests for a model that is loading join that load; a model that does not fit waits (bounded)
for busy ones or is refused at once with the numbers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from modeld import memory, paths, protocol
from modeld.cache.policy import CachePolicy, EntryState, EvictionReason, ModelKey
from modeld.config import Settings
from modeld.daemon import sizing
from modeld.daemon.jobs import Job, Send, Slot, Waiting, ps_rows
from modeld.daemon.supervisor import Runner, Supervisor
from modeld.errors import (
    ContextExceededError,
    ModeldError,
    RequestTimeoutError,
    ShuttingDownError,
    format_bytes,
)
from modeld.modelinfo import ModelInfo
from modeld.runner import protocol as runner_protocol

#: A runner that holds more than this above its baseline after closing its model is stopped
#: rather than reused (measured: ~7 MiB after close + malloc_trim on gemma-3-270m).
RECYCLE_SLACK_BYTES = 32 << 20

log = logging.getLogger("modeld.daemon")

#: A model used less than this long ago is not evicted yet (its client may be about to send
#: the next request): swaps then group requests by model instead of thrashing per request.
#: Not when that client is the one asking for the other model (:meth:`_moved_on`).
SWAP_GRACE_S = 0.25

#: Used for a runner's memory before any runner has said hello (replaced by measurements).
DEFAULT_RUNNER_BASELINE = memory.RUNNER_BASELINE

#: How long after the spare runner started a load waits for its ``hello`` when none has reported
#: a measured baseline yet: a load that arrives right after start would otherwise be sized
#: (n_ctx, reservation) with the built-in guess. A runner says hello ~0.5 s after start.
BASELINE_WAIT_S = 5.0


class SchedulerCore:
    """Intake, admission, dispatch and eviction; events (runner messages, cancels, explicit
    unloads, the timer) are in Scheduler."""

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
        self.slots: dict[ModelKey, Slot] = {}
        self.waiting: dict[ModelKey, Waiting] = {}
        self.jobs: dict[tuple[bytes, str], Job] = {}
        self.spare: str | None = None
        self.baseline = DEFAULT_RUNNER_BASELINE
        self.baseline_measured = False  # set by the first hello that carries an RSS
        self.infos: dict[ModelKey, ModelInfo] = {}
        self.stopping = False
        self._seq = 0
        self._last_file_check = 0.0
        self._spare_failures = 0
        self._spare_retry_at = 0.0
        # Usable CPUs (affinity, cgroup quota): read once, not on every request.
        self.cpu_threads = sizing.default_threads()
        self.recycling: set[str] = set()  # runners unloading their model to become the spare
        # Evicted models' prompt snapshots are kept on disk here (off with the prompt cache).
        self.prompt_cache_dir: str | None = (
            str(paths.prompt_cache_dir()) if settings.prompt_cache_mib > 0 else None
        )

    # ------------------------------------------------------------------ intake

    def submit(self, job: Job) -> None:
        """Route a new request: queue on its model, join a load or wait, or fail at once."""
        ident = (job.client, job.rid)
        if ident in self.jobs:
            self._reply_error(job, protocol.ProtocolError(f"request id {job.rid!r} is in use"))
            return
        queued = sum(len(s.queue) for s in self.slots.values())
        queued += sum(len(w.jobs) for w in self.waiting.values())
        if queued >= self.settings.max_queue:
            self._reply_error(
                job,
                RequestTimeoutError(
                    f"{queued} requests are already queued",
                    hint="retry later or raise max_queue",
                ),
            )
            return
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
            slot.queue.append(job)
            self.cache.enqueue(job.key)
            self._pump(slot)
            return
        self.cache.record_miss()
        job.waited_for_load = True
        waiting = self.waiting.get(job.key)
        if waiting is not None:
            waiting.jobs.append(job)
            return
        if slot is not None:  # draining: queue behind the older load it yields to
            deadline = self._clock() + self.settings.queue_timeout_s
            reason = "yielding memory to a model that has waited longer"
            self.waiting[job.key] = Waiting(job.key, job.name, [job], deadline, reason)
            return
        self._admit(job.key, job.name, [job], None)

    # ------------------------------------------------------------------ admission

    def model_info(self, key: ModelKey) -> ModelInfo:
        if key not in self.infos:
            self.infos[key] = sizing.read_info(key.path)
        return self.infos[key]

    def _admit(self, key: ModelKey, name: str, jobs: list[Job], waiting: Waiting | None) -> None:
        """Start loading ``key`` for ``jobs``, or make them wait, or fail them."""
        if not self._sized_with_measured_baseline(key, name, jobs, waiting):
            return
        requested = max((j.n_ctx for j in jobs if j.n_ctx is not None), default=None)
        asked = next((j.parallel for j in jobs if j.parallel is not None), None)
        try:
            info = self.model_info(key)
            size = sizing.size_for(
                info, key.mode, self.cache, key, self.baseline, requested, self.settings, asked
            )
        except ModeldError as exc:
            self._fail_admission(key, jobs, exc)
            return
        plan = self.cache.plan(key, size.need_bytes)
        if plan.action == "refuse":
            self._fail_admission(key, jobs, plan.error())
            return
        reason = plan.reason
        if plan.action == "evict":
            # Memory of models already on their way out is charged until their runners exit;
            # when it is enough, wait for it instead of evicting more models.
            unloading = sum(
                e.accounted_bytes for e in self.cache.entries() if e.state is EntryState.UNLOADING
            )
            for_slots = any(plan.victim_reason(v) is EvictionReason.SLOTS for v in plan.victims)
            now = self._clock()
            recent = any(
                now - e.last_used < SWAP_GRACE_S and not self._moved_on(v, jobs)
                for v, e in ((v, self.cache.get(v)) for v in plan.victims)
                if e is not None
            )
            if recent:
                reason = f"{reason}; giving just-used models a moment for follow-up requests"
            elif for_slots or plan.available_bytes + unloading < size.need_bytes:
                for victim in plan.victims:
                    self.evict(victim, plan.victim_reason(victim))
            plan = self.cache.plan(key, size.need_bytes)
            if not recent:
                reason = f"{reason}; waiting for unloading models to exit"
        if plan.action != "admit":
            if waiting is None:
                waiting = Waiting(key, name, jobs, self._clock() + self.settings.queue_timeout_s)
                self.waiting[key] = waiting
                log.info("%s waits for room: %s", name, reason)
            waiting.reason = reason if plan.action == "evict" else plan.reason
            waiting.need_bytes = size.need_bytes
            return
        self.waiting.pop(key, None)
        self._start_load(key, name, jobs, info, size, any(j.pinned for j in jobs))

    def _sized_with_measured_baseline(
        self, key: ModelKey, name: str, jobs: list[Job], waiting: Waiting | None
    ) -> bool:
        """False (``jobs`` now wait, as an event-driven :class:`Waiting`) while the first
        measured runner baseline is about to arrive; sizing goes on once it has or after
        :data:`BASELINE_WAIT_S`. The wait does not count against ``queue_timeout_s``."""
        starting = self._baseline_runner()
        if starting is not None:
            if waiting is None:
                waiting = Waiting(key, name, jobs, self._clock() + self.settings.queue_timeout_s)
                self.waiting[key] = waiting
                log.info("%s waits for runner %s to report its baseline", name, starting.id)
            waiting.for_baseline = True
            waiting.reason = f"waiting for runner {starting.id} to start and report its memory"
            return False
        if waiting is not None and waiting.for_baseline:
            waiting.for_baseline = False
            waiting.deadline = self._clock() + self.settings.queue_timeout_s
            if not self.baseline_measured:
                log.warning(
                    "no runner reported its baseline within %g s; sizing %s with the default %s",
                    BASELINE_WAIT_S,
                    name,
                    format_bytes(self.baseline),
                )
        return True

    def _baseline_runner(self) -> Runner | None:
        """The spare runner, still starting, whose hello will bring the first measured
        baseline; None when one was measured already, there is no such spare (``spare_runner``
        off: the load's own runner starts with it) or it has taken over
        :data:`BASELINE_WAIT_S`."""
        if self.baseline_measured or self.stopping or self.spare is None:
            return None
        runner = self.sup.runners.get(self.spare)
        if (
            runner is None
            or runner.ready
            or runner.stopping_since is not None
            or time.monotonic() - runner.started_at >= BASELINE_WAIT_S  # supervisor's clock
        ):
            return None
        return runner

    def _moved_on(self, victim: ModelKey, jobs: list[Job]) -> bool:
        """True when the client that used ``victim`` last is the one now asking for another
        model: no follow-up for ``victim`` is coming from it, so the swap grace would only add
        delay (a client working through models in turn paid 0.25 s per switch; bench trace)."""
        slot = self.slots.get(victim)
        last = slot.last_client if slot is not None else None
        return last is not None and all(job.client == last for job in jobs)

    def _fail_admission(self, key: ModelKey, jobs: list[Job], exc: ModeldError) -> None:
        """Fail jobs whose admission failed; a context-grown retry fails with context_exceeded."""
        self.waiting.pop(key, None)
        for job in list(jobs):
            err = exc
            if job.ctx_retries and not isinstance(exc, ContextExceededError):
                err = ContextExceededError(
                    f"the prompt needs a context of {job.n_ctx} tokens but it cannot be loaded: "
                    f"{exc.message}",
                    hint="shorten the prompt, free memory, or raise the memory budget",
                    details=dict(exc.details),
                )
            self._finish(job, err)

    def _start_load(
        self,
        key: ModelKey,
        name: str,
        jobs: list[Job],
        info: ModelInfo,
        size: sizing.Sizing,
        pinned: bool,
    ) -> None:
        runner = self._take_runner()
        keep = next((j.keep_alive_s for j in jobs if j.keep_alive_s is not None), None)
        self.cache.begin_load(
            key,
            size.need_bytes,
            size.n_ctx,
            size.reason,
            runner.id,
            pinned=pinned,
            keep_alive_s=keep if keep is not None else self.settings.keep_alive_s,
        )
        slot = Slot(key, name, runner.id, info, runner_pid=runner.pid)
        slot.parallel = slot.planned_parallel = size.parallel
        slot.parallel_reason = size.parallel_reason
        slot.asked_parallel = next((j.parallel for j in jobs if j.parallel is not None), None)
        self.slots[key] = slot
        for job in jobs:
            slot.queue.append(job)
            self.cache.enqueue(key)
        log.info(
            "loading %s in runner %s: n_ctx %d (%s), parallel %d (%s), estimate %s",
            name,
            runner.id,
            size.n_ctx,
            size.reason,
            size.parallel,
            size.parallel_reason,
            format_bytes(size.need_bytes),
        )
        threads = self.settings.threads or self.cpu_threads
        msg = runner_protocol.load(
                key.path,
                mode=key.mode,
                n_ctx=size.n_ctx,
                n_threads=threads,
                seed=0,
                prompt_cache_mib=self.settings.prompt_cache_mib,
                # a waiting request is the warm-up: a separate one would only delay it
                warm_up=not any(j.kind != "load" for j in jobs),
                prompt_cache_dir=self.prompt_cache_dir,
                parallel=size.parallel,
        )
        self.sup.send(runner.id, msg)

    def _take_runner(self) -> Runner:
        if self.spare is not None and self.spare in self.sup.runners:
            runner = self.sup.runners[self.spare]
            self.spare = None
            if runner.stopping_since is None and self.sup.responsive(runner):
                return runner
            if runner.stopping_since is None:  # stopped or stuck: never hand it a load
                log.warning("spare runner %s is not answering; starting another", runner.id)
                self.sup.stop(runner.id)
        self.spare = None
        return self.sup.spawn()

    def ensure_spare(self) -> None:
        """Keep one idle runner started (llama_cpp imported) so a cold load skips that cost.

        Not while a model is loading: the new runner's import (about half a second of CPU)
        would compete with the load and its warm-up. On 2 cores that made a gemma-270m load
        0.8-2.6 s instead of 0.4 s (bench/b_daemon.py cold_load; docs/benchmarks.md).
        """
        if (
            self.settings.spare_runner
            and self.spare is None
            and not self.stopping
            and self._clock() >= self._spare_retry_at
            and not any(e.state is EntryState.LOADING for e in self.cache.entries())
            and not self.recycling  # an evicted runner is about to become the spare
        ):
            self.spare = self.sup.spawn().id

    # ------------------------------------------------------------------ dispatch

    def _pump(self, slot: Slot) -> None:
        """Send queued requests of ``slot`` to its runner, FIFO, up to ``slot.parallel`` at
        once. A deterministic greedy request (``Job.alone``) waits for the runner to be free
        and has it to itself, unless the runner reports batching never changes greedy tokens.
        A request that needs a reload waits until nothing runs (a busy runner is never
        stopped)."""
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
            if self._needs_reload(slot, job, entry.n_ctx):
                if not slot.active:
                    self._reload(slot)
                return
            slot.queue.popleft()
            self.cache.dequeue(slot.key)
            if job.kind == "load":
                if job.pinned:
                    self.cache.set_pinned(slot.key, True)
                self.cache.touch(slot.key, job.keep_alive_s)
                self._finish(job, protocol.done(job.rid, model=self.row(slot.key)))
                continue
            self.cache.acquire(slot.key)
            slot.last_client = job.client
            self._seq += 1
            job.runner_rid = f"q{self._seq}"
            slot.active[job.runner_rid] = job
            msg = dict(job.payload, rid=job.runner_rid, n_threads=self._threads_for_request())
            if not self.sup.send(slot.runner_id, msg):
                log.warning("runner %s unreachable; treating it as crashed", slot.runner_id)

    @staticmethod
    def _needs_reload(slot: Slot, job: Job, n_ctx: int) -> bool:
        """A larger context, or (an explicit ``load``) another ``parallel`` than loaded."""
        if job.n_ctx is not None and job.n_ctx > n_ctx:
            return True
        return (
            job.kind == "load"
            and job.parallel is not None
            and job.parallel not in (slot.asked_parallel, slot.planned_parallel)
        )

    def _threads_for_request(self) -> int:
        """CPU threads for a request about to start: the configured count, else the usable
        CPUs shared among the runners generating right now (this one included; a runner's
        sequences share its decode calls, so they count once)."""
        if self.settings.threads:
            return self.settings.threads
        active = max(1, sum(1 for s in self.slots.values() if s.active))
        return max(1, self.cpu_threads // active)

    def _reload(self, slot: Slot) -> None:
        """Reload an idle entry with a larger context for the job at the head of its queue."""
        jobs = list(slot.queue)
        slot.queue.clear()
        for _ in jobs:
            self.cache.dequeue(slot.key)
        self.evict(slot.key, EvictionReason.RELOAD)
        waiting = self.waiting.get(slot.key)
        if waiting is not None:
            waiting.jobs[:0] = jobs
        else:
            self._admit(slot.key, slot.name, jobs, None)

    def _finish(self, job: Job, result: ModeldError | protocol.Message) -> None:
        if self.jobs.get((job.client, job.rid)) is job:
            del self.jobs[(job.client, job.rid)]
        msg = (
            result
            if isinstance(result, protocol.Message)
            else (protocol.error_reply(job.rid, result))
        )
        if not job.client_gone:
            self._send(job, msg)

    def _reply_error(self, job: Job, err: ModeldError) -> None:
        self._send(job, protocol.error_reply(job.rid, err))

    # ------------------------------------------------------------------ timers helpers

    def _idle(self, slot: Slot) -> bool:
        entry = self.cache.get(slot.key)
        return (
            entry is not None
            and entry.state is EntryState.READY
            and not slot.active
            and not slot.queue
            and entry.in_flight == 0
        )

    def _retire_stale(self, key: ModelKey) -> None:
        for slot in self.slots.values():
            if slot.key != key and slot.key.path == key.path and slot.key.mode == key.mode:
                slot.retire = EvictionReason.FILE_CHANGED

    # ------------------------------------------------------------------ eviction

    def evict(self, key: ModelKey, reason: EvictionReason) -> None:
        """Take ``key`` out of service; its memory is freed when its runner has exited."""
        slot = self.slots.pop(key, None)
        if self.cache.get(key) is not None:
            self.cache.begin_unload(key, reason)
        if slot is not None:
            log.info("unloading %s (%s)", slot.name, reason.value)
            self._retire_runner(slot.runner_id)

    def _retire_runner(self, runner_id: str) -> None:
        """Stop the runner of an evicted model, or have it close the model so it can be reused:
        each model switch then hands the freed process on as the next spare instead of starting
        one (about half a second of CPU for Python and llama_cpp; bench trace). Its memory
        stays charged until it reports what it still holds (:meth:`on_unloaded`) or exits."""
        runner = self.sup.runners.get(runner_id)
        if (
            self.settings.spare_runner
            and not self.recycling
            and not self.stopping
            and runner is not None
            and runner.ready
            and runner.stopping_since is None
        ):
            self.recycling.add(runner_id)
            self.sup.send(runner_id, runner_protocol.unload())
        else:
            self.sup.stop(runner_id)

    def shutdown(self) -> None:
        """Fail every open request with ``shutting_down`` (runners are stopped by the daemon)."""
        self.stopping = True
        for job in list(self.jobs.values()):
            self._finish(
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

    # ------------------------------------------------------------------ views

    def ps_rows(self) -> list[dict[str, Any]]:
        return ps_rows(self.cache, self.slots, self.waiting, self.sup.runners, self._clock())

    def row(self, key: ModelKey) -> dict[str, Any]:
        """The ``ps`` row of ``key`` (what a ``load`` reply carries)."""
        for r in self.ps_rows():
            if r["path"] == key.path and r["mode"] == key.mode and r["state"] != "waiting":
                return r
        return {"path": key.path, "mode": key.mode, "state": "unloaded"}

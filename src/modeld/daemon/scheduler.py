"""Request scheduling: which runner serves which request, when models load, wait and leave.

Owned and called only by the daemon's event loop (single-threaded, so no locks). It joins the
pure cache policy (:mod:`modeld.cache.policy`) to real runner processes
(:mod:`modeld.daemon.supervisor`):
requests for one model queue FIFO on its slot; different models run in parallel; requests
for a model that is loading join that load; a model that does not fit waits (bounded) for busy
ones or is refused at once with the numbers. :class:`SchedulerCore` has intake, admission and
eviction; this module adds what reacts to events: runner messages and exits, client cancels,
vanished clients and explicit unloads, and the timer.
"""

from __future__ import annotations

import logging
from typing import Any

from modeld import protocol
from modeld.cache.policy import EntryState, EvictionReason, ModelKey
from modeld.daemon import sizing
from modeld.daemon.jobs import Job, Slot, done_body
from modeld.daemon.scheduler_core import RECYCLE_SLACK_BYTES, SchedulerCore
from modeld.daemon.supervisor import Runner
from modeld.errors import (
    CancelledError,
    ContextExceededError,
    InvalidModelError,
    ModeldError,
    RequestTimeoutError,
    RunnerCrashedError,
    error_from_dict,
    format_bytes,
)
from modeld.runner import protocol as runner_protocol

log = logging.getLogger("modeld.daemon")


class Scheduler(SchedulerCore):
    """All model and request state of the daemon; see the module docstring."""

    # ------------------------------------------------------------------ runner events

    def on_runner_message(self, runner: Runner, msg: dict[str, Any]) -> None:
        mtype = msg["type"]
        if mtype == "hello":
            rss = runner.baseline.get("rss")
            if isinstance(rss, int) and rss > 0:
                self.baseline = rss
                self.baseline_measured = True
            log.info("runner %s is ready: baseline %s", runner.id, format_bytes(self.baseline))
            if self.waiting:
                self.retry_waiting()  # loads held back to be sized with a measured baseline
            return
        if mtype == "unloaded":
            reusable = self.on_unloaded(runner, msg)
            self.retry_waiting()  # its memory may be what a waiting load needs (takes the spare)
            if reusable:
                self.adopt_spare(runner)  # ... and this runner takes the spare's place
            return
        slot = self._slot_of(runner.id)
        if slot is None:
            if mtype not in ("memory", "error"):
                log.debug("ignoring %s from runner %s without a model", mtype, runner.id)
            return
        if mtype == "loaded":
            self._on_loaded(slot, runner, msg)
        elif mtype == "load_failed":
            err = error_from_dict(msg)
            self._load_failed(slot, err)
        elif mtype in ("chunk", "done", "error"):
            rid = msg.get("rid")
            job = slot.active.get(rid) if isinstance(rid, str) else None
            if job is None:
                log.debug("stale %s from runner %s", mtype, runner.id)
                return
            if mtype == "chunk":
                text = msg.get("text")
                if isinstance(text, str) and not job.client_gone:
                    self._deliver(job, protocol.chunk(job.rid, text), slot)
            elif mtype == "done":
                self._on_done(slot, job, msg)
            else:
                self._on_error(slot, job, msg)
        elif mtype == "memory":
            footprint = msg.get("memory")
            if isinstance(footprint, dict) and isinstance(footprint.get("rss"), int):
                self.cache.update_measured(slot.key, int(footprint["rss"]))

    def on_unloaded(self, runner: Runner, msg: dict[str, Any]) -> bool:
        """A runner closed its model. True (and its memory released) when it gave the memory
        back and may be reused; otherwise it is stopped and its memory is freed on exit."""
        self.recycling.discard(runner.id)
        footprint = msg.get("footprint")
        held = footprint.get("rss") if isinstance(footprint, dict) else None
        if (
            isinstance(held, int)
            and held <= RECYCLE_SLACK_BYTES
            and not self.stopping
            and runner.stopping_since is None
        ):
            self.cache.unload_finished(runner.id)
            return True
        log.info("runner %s kept %s after unloading; stopping it", runner.id,
                 format_bytes(held) if isinstance(held, int) else "an unknown amount")
        self.sup.stop(runner.id)
        return False

    def adopt_spare(self, runner: Runner) -> None:
        """An idle, reusable runner: the spare if there is none, else it is not needed."""
        if self.spare is None and not self.stopping and runner.id in self.sup.runners:
            self.spare = runner.id
            log.info("runner %s is reused as the spare", runner.id)
        else:
            self.sup.stop(runner.id)

    def _slot_of(self, runner_id: str) -> Slot | None:
        for slot in self.slots.values():
            if slot.runner_id == runner_id:
                return slot
        return None

    def _on_loaded(self, slot: Slot, runner: Runner, msg: dict[str, Any]) -> None:
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
            measured += sizing.prompt_cache_bytes(slot.key.mode, self.settings)
        n_ctx = msg.get("n_ctx")
        entry = self.cache.get(slot.key)
        if entry is None:
            return
        parallel = msg.get("parallel")  # absent: a runner that decodes one sequence
        slot.parallel = parallel if isinstance(parallel, int) and parallel >= 1 else 1
        slot.batch_invariant = msg.get("greedy_batch_invariant") is True
        load_s = self._clock() - slot.load_started
        self.cache.load_succeeded(
            slot.key, measured, int(n_ctx) if isinstance(n_ctx, int) else entry.n_ctx, load_s
        )
        log.info(
            "loaded %s in %.2f s: n_ctx %d, parallel %d, measured %s (estimate %s)",
            slot.name,
            load_s,
            entry.n_ctx,
            slot.parallel,
            format_bytes(measured or 0),
            format_bytes(entry.estimate_bytes),
        )
        self._rebalance()
        self._pump(slot)

    def _rebalance(self) -> None:
        plan = self.cache.rebalance()
        if plan is not None and plan.action == "evict":
            for victim in plan.victims:
                self.evict(victim, plan.victim_reason(victim))

    def _load_failed(self, slot: Slot, err: ModeldError) -> None:
        log.warning("loading %s failed: %s", slot.name, err)
        # A runner still running may hold the model's memory until it exits (a timed-out
        # load goes on reading it): keep that charged so nothing is admitted on it meanwhile.
        alive = slot.runner_id in self.sup.runners
        self.cache.load_failed(slot.key, err.message, err.code.value, runner_alive=alive)
        self.slots.pop(slot.key, None)
        self.sup.stop(slot.runner_id)
        for job in slot.queue:
            self._finish(job, err)
        slot.queue.clear()

    def _on_done(self, slot: Slot, job: Job, msg: dict[str, Any]) -> None:
        entry = self.cache.get(slot.key)
        body = done_body(slot, job, entry, msg, self._clock())
        timings = body["timings"]
        self.cache.record_tokens(
            int(timings.get("completion_tokens", 0)), int(timings.get("prompt_tokens", 0))
        )
        self._note_peak_memory(slot, msg.get("memory"))
        self._release(slot, job)
        self._finish(job, protocol.done(job.rid, **body))
        self._after_release(slot)
        self._rebalance()

    def _note_peak_memory(self, slot: Slot, memory: object) -> None:
        """Account the runner's peak RSS: a model grows after load (its compute buffers and
        KV pages are touched by the first full batches), so the load-time figure under-counts."""
        entry = self.cache.get(slot.key)
        if entry is None or not isinstance(memory, dict) or not isinstance(memory.get("rss"), int):
            return
        peak = max(int(memory["rss"]), entry.measured_bytes or 0)
        if peak != entry.measured_bytes:
            self.cache.update_measured(slot.key, peak)

    def _on_error(self, slot: Slot, job: Job, msg: dict[str, Any]) -> None:
        err = error_from_dict(msg)
        self._release(slot, job)
        if (
            isinstance(err, ContextExceededError)
            and not job.cancel_sent
            and self._grow_context(slot, job, err)
        ):
            self._after_release(slot)
            return
        if job.cancel_sent and not isinstance(err, CancelledError):
            err = CancelledError("request cancelled")
        self._finish(job, err)
        self._after_release(slot)

    def _release(self, slot: Slot, job: Job) -> None:
        """One sequence ended; the keep-alive clock starts when the last one has."""
        slot.active.pop(job.runner_rid, None)
        if self.cache.get(slot.key) is not None:
            self.cache.release(slot.key, job.keep_alive_s)

    def _after_release(self, slot: Slot) -> None:
        self._pump(slot)
        self.expire()
        self.retry_waiting()

    def _grow_context(self, slot: Slot, job: Job, err: ContextExceededError) -> bool:
        """Requeue ``job`` at the head with a larger context (True), or fail it (True), or
        return False when the error carries no token count (it is then passed on as is)."""
        prompt_tokens = err.details.get("prompt_tokens")
        if not isinstance(prompt_tokens, int) or job.ctx_retries >= 2:
            return False
        try:
            job.n_ctx = sizing.context_for_prompt(
                slot.info, slot.name, slot.key, self.cache, self.baseline, self.settings,
                prompt_tokens, int(job.payload.get("max_tokens", 256)), slot.planned_parallel,
            )  # fmt: skip
        except ContextExceededError as exc:
            exc.details.setdefault("n_ctx", err.details.get("n_ctx"))
            self._finish(job, exc)
            return True
        job.ctx_retries += 1
        log.info("%s: %d prompt tokens need n_ctx %d", slot.name, prompt_tokens, job.n_ctx)
        slot.queue.appendleft(job)
        self.cache.enqueue(slot.key)
        return True

    def on_runner_exit(self, runner: Runner) -> None:
        """A runner process ended: free its memory; fail or re-route its requests."""
        self.recycling.discard(runner.id)
        if self.spare == runner.id:
            self.spare = None
            # A spare that dies before saying hello (broken install): back off, do not loop.
            self._spare_failures = 0 if runner.ready else self._spare_failures + 1
            self._spare_retry_at = self._clock() + min(60.0, 0.5 * 2**self._spare_failures)
            log.warning("spare runner %s exited with code %s", runner.id, runner.exit_code)
        self.cache.unload_finished(runner.id)
        slot = self._slot_of(runner.id)
        if slot is not None:
            entry = self.cache.get(slot.key)
            why = f"runner {runner.id} (pid {runner.pid}) exited with code {runner.exit_code}"
            if runner.stalled_s is not None:
                why = (
                    f"runner {runner.id} (pid {runner.pid}) stopped answering for "
                    f"{runner.stalled_s:.0f} s (stopped, or stuck) and was killed"
                )
            if entry is not None and entry.state is EntryState.LOADING and runner.stalled_s:
                self._load_failed(
                    slot,
                    RunnerCrashedError(
                        f"loading {slot.name} failed: {why}",
                        hint="retry; if it happens again see the runner log, or raise "
                        "runner_stall_s if this machine pauses processes that long",
                        details={"stalled_s": runner.stalled_s, "path": slot.key.path},
                    ),
                )
                self.cache.clear_failure(slot.key)  # not the file's fault: no cool-down
            elif entry is not None and entry.state is EntryState.LOADING:
                self._load_failed(
                    slot,
                    InvalidModelError(
                        f"{slot.name} could not be loaded: {why} while loading",
                        hint="the file may be corrupt or unsupported; see the runner log",
                        details={"exit_code": runner.exit_code, "path": slot.key.path},
                    ),
                )
            else:
                log.warning("%s: %s", slot.name, why)
                self.slots.pop(slot.key, None)
                if entry is not None:
                    self.cache.remove(slot.key, EvictionReason.CRASH)
                for job in list(slot.active.values()):
                    self._finish(
                        job,
                        RunnerCrashedError(
                            f"the runner of {slot.name} crashed: {why}",
                            hint="retry; the model is loaded again on the next request"
                            + ("" if runner.stalled_s is None else
                               " (a runner silent for runner_stall_s is killed: raise it if "
                               "this machine pauses processes that long)"),
                            details={"exit_code": runner.exit_code,
                                     "stalled_s": runner.stalled_s},
                        ),
                    )
                slot.active.clear()
                requeue = list(slot.queue)
                slot.queue.clear()
                for job in requeue:
                    self._route(job)
        self.retry_waiting()

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
        slot = self.slots.get(job.key)
        if slot is not None and slot.active.get(job.runner_rid) is job:
            if not job.cancel_sent:
                job.cancel_sent = True
                self.sup.send(slot.runner_id, runner_protocol.cancel(job.runner_rid))
            return
        if slot is not None and job in slot.queue:
            slot.queue.remove(job)
            self.cache.dequeue(job.key)
        waiting = self.waiting.get(job.key)
        if waiting is not None and job in waiting.jobs:
            waiting.jobs.remove(job)
            if not waiting.jobs:
                del self.waiting[job.key]
        self._finish(job, CancelledError("request cancelled"))

    def _deliver(self, job: Job, msg: protocol.Message, slot: Slot | None = None) -> None:
        if job.client_gone:
            return
        if not self._send(job, msg):
            log.info("client of %s went away; cancelling", job.rid)
            self.client_gone(job.client)

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
            if self._idle(slot):
                self.evict(key, EvictionReason.EXPLICIT)
                now_names.append(slot.name)
            else:
                slot.retire = EvictionReason.EXPLICIT
                later.append(slot.name)
        return now_names, later

    # ------------------------------------------------------------------ timers

    def tick(self) -> None:
        """Periodic work: stalled and dead runners, keep-alive, retirements, waits, load
        timeouts."""
        self.sup.kill_stalled(self.settings.runner_stall_s)
        for runner in self.sup.reap():
            self.on_runner_exit(runner)
        self.expire()
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
            if slot.retire is not None and self._idle(slot):
                self.evict(slot.key, slot.retire)
            elif entry.state is EntryState.LOADING and (
                now - slot.load_started > self.settings.load_timeout_s
            ):
                self.sup.stop(slot.runner_id)
                self._load_failed(
                    slot,
                    RequestTimeoutError(
                        f"loading {slot.name} took longer than {self.settings.load_timeout_s:g} s",
                        hint="raise load_timeout_s or check the runner log",
                    ),
                )
        for waiting in list(self.waiting.values()):
            if now >= waiting.deadline and not waiting.for_baseline:
                self.waiting.pop(waiting.key, None)
                for job in waiting.jobs:
                    self._finish(
                        job,
                        RequestTimeoutError(
                            f"waited {self.settings.queue_timeout_s:g} s for room to load "
                            f"{waiting.name}: {waiting.reason}",
                            hint="retry later, unload other models, or raise the memory budget",
                        ),
                    )
        self.retry_waiting()
        self.ensure_spare()

    def expire(self) -> None:
        for entry in self.cache.expired():
            slot = self.slots.get(entry.key)
            if slot is None or self._idle(slot):
                self.evict(entry.key, EvictionReason.KEEP_ALIVE)

    def retry_waiting(self) -> None:
        """Admit waiting loads in arrival order, after choosing which busy models drain."""
        self._choose_draining()
        for waiting in list(self.waiting.values()):
            if self.waiting.get(waiting.key) is not waiting:
                continue
            if not waiting.jobs:
                self.waiting.pop(waiting.key, None)
                continue
            slot = self.slots.get(waiting.key)
            if slot is not None:  # its model is resident and no longer draining: rejoin it
                if slot.draining:
                    continue
                self.waiting.pop(waiting.key, None)
                for job in waiting.jobs:
                    slot.queue.append(job)
                    self.cache.enqueue(slot.key)
                self._pump(slot)
                continue
            self._admit(waiting.key, waiting.name, waiting.jobs, waiting)

    def _choose_draining(self) -> None:
        """Fairness: the oldest waiting load may claim busy models' memory.

        Without this, a model that stays busy (a steady stream of requests) would starve a
        waiting one until its queue timeout. The least recently used busy, unpinned models
        whose memory the oldest waiting load needs stop taking new requests (those wait
        behind it); once their queued requests are done they are idle and get evicted.
        """
        was = {key for key, slot in self.slots.items() if slot.draining}
        for slot in self.slots.values():
            slot.draining = False
        oldest = next((w for w in self.waiting.values() if w.key not in self.slots), None)
        if oldest is None or oldest.need_bytes <= 0:
            return
        cache = self.cache
        for key in was:  # drained and now idle: stays put aside until the waiting load takes it
            entry = cache.get(key)
            if entry is not None and entry.evictable:
                self.slots[key].draining = True
        entries = cache.entries()
        room = cache.budget_bytes - sum(
            e.accounted_bytes for e in entries if e.state is not EntryState.UNLOADING
        )
        room += sum(e.accounted_bytes for e in cache.lru_order())
        slots_free = cache.max_models - cache.slots_used() + len(cache.lru_order())
        busy = sorted(  # models already draining first (sticky), then least recently used
            (e for e in entries if e.state is EntryState.READY and e.busy and not e.pinned),
            key=lambda e: (e.key not in was, e.last_used),
        )
        drain: list[Slot] = []
        for entry in busy:
            if room >= oldest.need_bytes and slots_free >= 1:
                break
            victim = self.slots.get(entry.key)
            if victim is not None:
                drain.append(victim)
                room += entry.accounted_bytes
                slots_free += 1
        if room >= oldest.need_bytes and slots_free >= 1:
            for victim in drain:
                victim.draining = True

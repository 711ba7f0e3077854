"""Request scheduling: which runner serves which request, when models load, wait and leave.

Owned and called only by the daemon's event loop (single-threaded, so no locks). It joins the
pure cache policy (:mod:`modeld.cache`) to real runner processes (:mod:`modeld.supervisor`):
requests for one model queue FIFO on its :class:`Slot`; different models run in parallel;
requests for a model that is loading join that load; a model that does not fit waits (bounded)
for busy ones or is refused at once with the numbers.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modeld import memory, protocol, runner_protocol, sizing
from modeld.cache import CachePolicy, EntryState, EvictionReason, ModelKey, parse_keep_alive
from modeld.config import Settings
from modeld.errors import (
    CancelledError,
    ContextExceededError,
    InvalidModelError,
    ModeldError,
    ModelNotFoundError,
    RequestTimeoutError,
    RunnerCrashedError,
    ShuttingDownError,
    error_from_dict,
    format_bytes,
)
from modeld.modelinfo import ModelInfo
from modeld.supervisor import Runner, Supervisor

log = logging.getLogger("modeld.daemon")

#: Used for a runner's memory before any runner has said hello (replaced by measurements).
DEFAULT_RUNNER_BASELINE = memory.RUNNER_BASELINE


@dataclass(eq=False)
class Job:
    """One client request that needs a model (generate, embed or load)."""

    client: bytes  # ROUTER identity of the client
    rid: str  # the client's request id
    kind: str  # "generate" | "embed" | "load"
    key: ModelKey
    name: str
    payload: dict[str, Any] = field(default_factory=dict)  # runner message body (no rid)
    keep_alive_s: float | None = None
    n_ctx: int | None = None  # requested (or needed after context_exceeded)
    pinned: bool = False
    created: float = field(default_factory=time.monotonic)
    runner_rid: str = ""
    waited_for_load: bool = False
    ctx_retries: int = 0
    cancel_sent: bool = False
    client_gone: bool = False


@dataclass(eq=False)
class Slot:
    """Daemon-side state of one cache entry: its runner and its FIFO queue."""

    key: ModelKey
    name: str
    runner_id: str
    info: ModelInfo
    queue: deque[Job] = field(default_factory=deque)
    current: Job | None = None
    retire: EvictionReason | None = None  # evict once idle (file changed, explicit unload)
    load_started: float = field(default_factory=time.monotonic)
    runner_pid: int | None = None


@dataclass(eq=False)
class Waiting:
    """Requests for a model that is not loaded yet and has no room yet."""

    key: ModelKey
    name: str
    jobs: list[Job]
    deadline: float
    reason: str = ""


Send = Callable[[Job, protocol.Message], bool]


class Scheduler:
    """All model and request state of the daemon; see the module docstring."""

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
        self.infos: dict[ModelKey, ModelInfo] = {}
        self.stopping = False
        self._seq = 0
        self._last_file_check = 0.0

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
        if slot is not None:
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
        self._admit(job.key, job.name, [job], None)

    # ------------------------------------------------------------------ admission

    def model_info(self, key: ModelKey) -> ModelInfo:
        info = self.infos.get(key)
        if info is None:
            from modeld.gguf import read_model_info

            try:
                info = read_model_info(key.path)
            except FileNotFoundError as exc:
                raise ModelNotFoundError(f"{key.path} does not exist") from exc
            except OSError as exc:
                raise InvalidModelError(f"cannot read {key.path}: {exc}") from exc
            self.infos[key] = info
        return info

    def _admit(self, key: ModelKey, name: str, jobs: list[Job], waiting: Waiting | None) -> None:
        """Start loading ``key`` for ``jobs``, or make them wait, or fail them."""
        requested = max((j.n_ctx for j in jobs if j.n_ctx is not None), default=None)
        try:
            info = self.model_info(key)
            size = sizing.size_for(
                info, key.mode, self.cache, key, self.baseline, requested, self.settings
            )
        except ModeldError as exc:
            self._fail_context_jobs(jobs, exc)
            return
        plan = self.cache.plan(key, size.need_bytes)
        if plan.action == "refuse":
            self._fail_context_jobs(jobs, plan.error())
            return
        if plan.action == "evict":
            for victim in plan.victims:
                self.evict(victim, plan.victim_reason(victim))
            plan = self.cache.plan(key, size.need_bytes)
        if plan.action != "admit":
            if waiting is None:
                waiting = Waiting(key, name, jobs, self._clock() + self.settings.queue_timeout_s)
                self.waiting[key] = waiting
                log.info("%s waits for room: %s", name, plan.reason)
            waiting.reason = plan.reason
            return
        self.waiting.pop(key, None)
        self._start_load(key, name, jobs, info, size, any(j.pinned for j in jobs))

    def _fail_context_jobs(self, jobs: list[Job], exc: ModeldError) -> None:
        """Fail jobs whose admission failed; a context-grown retry fails with context_exceeded."""
        for job in jobs:
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
        self.slots[key] = slot
        for job in jobs:
            slot.queue.append(job)
            self.cache.enqueue(key)
        log.info(
            "loading %s in runner %s: n_ctx %d (%s), estimate %s",
            name,
            runner.id,
            size.n_ctx,
            size.reason,
            format_bytes(size.need_bytes),
        )
        threads = self.settings.threads or sizing.default_threads()
        self.sup.send(
            runner.id,
            runner_protocol.load(
                key.path, mode=key.mode, n_ctx=size.n_ctx, n_threads=threads, seed=0
            ),
        )

    def _take_runner(self) -> Runner:
        if self.spare is not None and self.spare in self.sup.runners:
            runner = self.sup.runners[self.spare]
            self.spare = None
            if runner.stopping_since is None:
                return runner
        self.spare = None
        return self.sup.spawn()

    def ensure_spare(self) -> None:
        if self.settings.spare_runner and self.spare is None and not self.stopping:
            self.spare = self.sup.spawn().id

    # ------------------------------------------------------------------ dispatch

    def _pump(self, slot: Slot) -> None:
        """Send the next queued request of ``slot`` to its runner (one at a time, FIFO)."""
        entry = self.cache.get(slot.key)
        while (
            entry is not None
            and entry.state is EntryState.READY
            and slot.current is None
            and slot.queue
            and self.slots.get(slot.key) is slot
        ):
            job = slot.queue[0]
            if job.n_ctx is not None and job.n_ctx > entry.n_ctx:
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
            slot.current = job
            self._seq += 1
            job.runner_rid = f"q{self._seq}"
            msg = dict(job.payload, rid=job.runner_rid)
            if not self.sup.send(slot.runner_id, msg):
                log.warning("runner %s unreachable; treating it as crashed", slot.runner_id)

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

    # ------------------------------------------------------------------ runner events

    def on_runner_message(self, runner: Runner, msg: dict[str, Any]) -> None:
        mtype = msg["type"]
        if mtype == "hello":
            self.baseline = int(runner.baseline.get("rss", self.baseline)) or self.baseline
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
            job = slot.current
            if job is None or msg.get("rid") != job.runner_rid:
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
        n_ctx = msg.get("n_ctx")
        entry = self.cache.get(slot.key)
        if entry is None:
            return
        load_s = self._clock() - slot.load_started
        self.cache.load_succeeded(
            slot.key, measured, int(n_ctx) if isinstance(n_ctx, int) else entry.n_ctx, load_s
        )
        log.info(
            "loaded %s in %.2f s: n_ctx %d, measured %s (estimate %s)",
            slot.name,
            load_s,
            entry.n_ctx,
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
        self.cache.load_failed(slot.key, err.message, err.code.value)
        self.slots.pop(slot.key, None)
        self.sup.stop(slot.runner_id)
        for job in slot.queue:
            self._finish(job, err)
        slot.queue.clear()

    def _on_done(self, slot: Slot, job: Job, msg: dict[str, Any]) -> None:
        entry = self.cache.get(slot.key)
        usage = msg.get("usage") if isinstance(msg.get("usage"), dict) else {}
        timings = msg.get("timings") if isinstance(msg.get("timings"), dict) else {}
        assert isinstance(usage, dict) and isinstance(timings, dict)
        completion = int(usage.get("completion_tokens", 0) or 0)
        prompt_tokens = int(usage.get("prompt_tokens", 0) or 0)
        self.cache.record_tokens(completion, prompt_tokens)
        load_s = entry.load_seconds if (entry and job.waited_for_load) else 0.0
        body: dict[str, Any] = {
            "model": slot.name,
            "n_ctx": entry.n_ctx if entry else None,
            "usage": usage,
        }
        if job.kind == "embed":
            body["embeddings"] = msg.get("embeddings", [])
            body["timings"] = {**timings, "load_s": load_s or 0.0}
        else:
            body["finish_reason"] = msg.get("finish_reason")
            body["timings"] = {
                "load_s": load_s or 0.0,
                "prompt_eval_s": timings.get("prompt_eval_s", 0.0),
                "generation_s": timings.get("generation_s", 0.0),
                "tokens_per_s": timings.get("tokens_per_s", 0.0),
                "prompt_tokens": prompt_tokens,
                "prompt_tokens_reused": int(usage.get("prompt_tokens_reused", 0) or 0),
                "completion_tokens": completion,
                "total_s": self._clock() - job.created,
            }
        self._release(slot, job)
        self._finish(job, protocol.done(job.rid, **body))
        self._after_release(slot)

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
        slot.current = None
        if self.cache.get(slot.key) is not None:
            self.cache.release(slot.key, job.keep_alive_s)

    def _after_release(self, slot: Slot) -> None:
        self._pump(slot)
        self.expire()
        self.retry_waiting()

    def _grow_context(self, slot: Slot, job: Job, err: ContextExceededError) -> bool:
        """Requeue ``job`` at the head with a larger context; False (job failed) if impossible."""
        prompt_tokens = err.details.get("prompt_tokens")
        if not isinstance(prompt_tokens, int) or job.ctx_retries >= 2:
            return False
        max_tokens = int(job.payload.get("max_tokens", 256))
        train = slot.info.context_length or (1 << 20)
        if prompt_tokens + 1 > train:
            self._finish(
                job,
                ContextExceededError(
                    f"the prompt has {prompt_tokens} tokens but {slot.name} was trained for "
                    f"{train} at most",
                    hint="shorten the prompt",
                    details={"prompt_tokens": prompt_tokens, "n_ctx_train": train},
                ),
            )
            return True
        want = min(train, prompt_tokens + min(max_tokens, 1024))
        want = min(sizing.round_up(want), max(256, train - train % 256))
        fits = sizing.max_context(
            slot.info, slot.key.mode, self.cache, slot.key, self.baseline, self.settings
        )
        if fits < prompt_tokens + 1:
            self._finish(
                job,
                ContextExceededError(
                    f"the prompt has {prompt_tokens} tokens but at most {fits} fit in the memory "
                    f"budget for {slot.name}",
                    hint="shorten the prompt, unload other models, or raise the memory budget",
                    details={
                        "prompt_tokens": prompt_tokens,
                        "n_ctx_max": fits,
                        "n_ctx": err.details.get("n_ctx"),
                    },
                ),
            )
            return True
        job.n_ctx = max(min(want, fits - fits % 256), sizing.round_up(prompt_tokens + 1))
        job.ctx_retries += 1
        log.info(
            "%s: prompt of %d tokens needs n_ctx %d; reloading", slot.name, prompt_tokens, job.n_ctx
        )
        slot.queue.appendleft(job)
        self.cache.enqueue(slot.key)
        return True

    def on_runner_exit(self, runner: Runner) -> None:
        """A runner process ended: free its memory; fail or re-route its requests."""
        if self.spare == runner.id:
            self.spare = None
        self.cache.unload_finished(runner.id)
        slot = self._slot_of(runner.id)
        if slot is not None:
            entry = self.cache.get(slot.key)
            why = f"runner {runner.id} (pid {runner.pid}) exited with code {runner.exit_code}"
            if entry is not None and entry.state is EntryState.LOADING:
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
                if slot.current is not None:
                    self._finish(
                        slot.current,
                        RunnerCrashedError(
                            f"the runner of {slot.name} crashed: {why}",
                            hint="retry; the model is loaded again on the next request",
                            details={"exit_code": runner.exit_code},
                        ),
                    )
                    slot.current = None
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
        if slot is not None and slot.current is job:
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

    # ------------------------------------------------------------------ timers

    def tick(self) -> None:
        """Periodic work: dead runners, keep-alive, retirements, waits, load timeouts."""
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
            if now >= waiting.deadline:
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

    def _idle(self, slot: Slot) -> bool:
        entry = self.cache.get(slot.key)
        return (
            entry is not None
            and entry.state is EntryState.READY
            and slot.current is None
            and not slot.queue
            and entry.in_flight == 0
        )

    def expire(self) -> None:
        for entry in self.cache.expired():
            slot = self.slots.get(entry.key)
            if slot is None or self._idle(slot):
                self.evict(entry.key, EvictionReason.KEEP_ALIVE)

    def retry_waiting(self) -> None:
        for waiting in list(self.waiting.values()):
            if self.waiting.get(waiting.key) is waiting and waiting.jobs:
                self._admit(waiting.key, waiting.name, waiting.jobs, waiting)
            elif not waiting.jobs:
                self.waiting.pop(waiting.key, None)

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
            self.sup.stop(slot.runner_id)

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

    def row(self, key: ModelKey) -> dict[str, Any]:
        """The ``ps`` row of ``key`` (what a ``load`` reply carries)."""
        for r in self.ps_rows():
            if r["path"] == key.path and r["mode"] == key.mode and r["state"] != "waiting":
                return r
        return {"path": key.path, "mode": key.mode, "state": "unloaded"}

    def ps_rows(self) -> list[dict[str, Any]]:
        now = self._clock()
        wall = time.time()
        rows: list[dict[str, Any]] = []
        for entry in self.cache.entries():
            slot = self.slots.get(entry.key)
            d = entry.to_dict(now)
            keep = entry.keep_alive_s
            runner = self.sup.runners.get(entry.runner_id)
            rows.append(
                {
                    "name": slot.name if slot else entry.key.name,
                    "path": entry.key.path,
                    "mode": entry.key.mode,
                    "state": d["state"],
                    "n_ctx": entry.n_ctx,
                    "ctx_reason": entry.ctx_reason,
                    "measured_bytes": entry.measured_bytes,
                    "estimate_bytes": entry.estimate_bytes,
                    "accounted_bytes": entry.accounted_bytes,
                    "in_flight": entry.in_flight,
                    "queued": len(slot.queue) if slot else 0,
                    "use_count": entry.use_count,
                    "last_used": wall - (now - entry.last_used),
                    "keep_alive_s": None if math.isinf(keep) else keep,
                    "keep_alive_left_s": d["expires_in_s"],
                    "forever": math.isinf(keep),
                    "pinned": entry.pinned,
                    "runner_id": entry.runner_id,
                    "runner_pid": runner.pid if runner else None,
                    "load_seconds": entry.load_seconds,
                    "retiring": slot.retire.value if slot and slot.retire else None,
                    "last_unload_reason": d["last_unload_reason"],
                }
            )
        for waiting in self.waiting.values():
            rows.append(
                {
                    "name": waiting.name,
                    "path": waiting.key.path,
                    "mode": waiting.key.mode,
                    "state": "waiting",
                    "n_ctx": None,
                    "ctx_reason": waiting.reason,
                    "measured_bytes": None,
                    "estimate_bytes": None,
                    "accounted_bytes": 0,
                    "in_flight": 0,
                    "queued": len(waiting.jobs),
                    "use_count": 0,
                    "last_used": None,
                    "keep_alive_s": None,
                    "keep_alive_left_s": None,
                    "forever": False,
                    "pinned": False,
                    "runner_id": None,
                    "runner_pid": None,
                    "load_seconds": None,
                    "retiring": None,
                    "last_unload_reason": None,
                }
            )
        return rows


def keep_alive_of(value: str | int | float | None, settings: Settings) -> float:
    """A request's keep-alive in seconds; the configured default when it did not set one.

    Per request, as in Ollama, but not sticky: a request without keep_alive gets the default,
    so one ``-1`` request does not pin the model for everyone after it.
    """
    return parse_keep_alive(value, settings.keep_alive)

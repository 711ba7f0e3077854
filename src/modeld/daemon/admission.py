"""Admission: whether a model that is not loaded may load now, and the requests that wait.

A load is sized (context, ``parallel``, memory) and planned against the cache policy: admitted,
admitted after evicting idle models, made to wait (bounded by ``queue_timeout_s``) for busy ones,
or refused at once with the numbers. Waiting loads are retried in arrival order whenever memory
or a slot may have been freed; the oldest may make busy models drain (fairness). Owned by the
daemon's event loop (no locks).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from modeld import projector, sizing
from modeld.cache.policy import CachePolicy, EntryState, EvictionReason, ModelKey
from modeld.config import Settings
from modeld.daemon.decisions import Decision, Evict, Pump, StartLoad
from modeld.daemon.dispatch import Dispatch
from modeld.daemon.jobs import Job, Waiting
from modeld.daemon.leases import leased_error
from modeld.daemon.pool import BASELINE_WAIT_S, RunnerPool
from modeld.errors import (
    ContextExceededError,
    ModeldError,
    RequestTimeoutError,
    format_bytes,
)
from modeld.model import placement
from modeld.model.gguf import ProjectorInfo
from modeld.model.modelinfo import ModelInfo

if TYPE_CHECKING:
    from modeld.model.probe import GpuMemory

log = logging.getLogger("modeld.daemon")

#: A model used less than this long ago is not evicted yet (its client may be about to send
#: the next request): swaps then group requests by model instead of thrashing per request.
#: Not when that client is the one asking for the other model (:meth:`Admission._moved_on`).
SWAP_GRACE_S = 0.25


class RpcSizing(TypedDict):
    """What a load on RPC workers tells its runner about sizing (runnerwire.load)."""

    rpc_ctx_floor: int | None
    rpc_memory: int | None


class Admission:
    """The loads waiting for room, by model, and the models' GGUF headers read so far."""

    def __init__(
        self,
        settings: Settings,
        cache: CachePolicy,
        pool: RunnerPool,
        dispatch: Dispatch,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.pool = pool
        self.dispatch = dispatch
        self._clock = clock
        self.waiting: dict[ModelKey, Waiting] = {}
        self.infos: dict[ModelKey, ModelInfo] = {}
        self.leases = dispatch.leases  # who holds which RPC worker (dispatch checks too)
        self._cuda_built: bool | None = None  # a CUDA library beside llama_cpp (read once)

    def model_info(self, key: ModelKey) -> ModelInfo:
        if key not in self.infos:
            self.infos[key] = sizing.read_info(key.path)
        return self.infos[key]

    def projector(self, key: ModelKey, name: str,
                  jobs: Sequence[Job] = ()) -> ProjectorInfo | None:
        """The image projector ``key`` loads with (generate mode): what a ``load`` named (this
        one's, else an earlier one's), the config's, or the one beside it (projector.py)."""
        if key.mode != "generate":
            return None
        before = self.dispatch.asked.get(key)
        asked = next((j.mmproj for j in jobs if j.mmproj is not None),
                     before.mmproj if before else None)  # fmt: skip
        return projector.find(Path(key.path), self.model_info(key), name, self.settings, asked)

    def queued(self) -> int:
        return sum(len(w.jobs) for w in self.waiting.values())

    # ------------------------------------------------------------------ a new request

    def join(self, job: Job, draining: bool) -> bool:
        """Add ``job`` to its model's waiting load, if there is one; or, when its model is
        ``draining`` (yielding to an older waiting load), make it wait behind that. False:
        neither, admit it."""
        waiting = self.waiting.get(job.key)
        if waiting is not None:
            waiting.jobs.append(job)
            return True
        if draining:
            deadline = self._clock() + self.settings.queue_timeout_s
            reason = "yielding memory to a model that has waited longer"
            self.waiting[job.key] = Waiting(job.key, job.name, [job], deadline, reason)
            return True
        return False

    def where(self, key: ModelKey, name: str, jobs: list[Job]) -> placement.Where:
        """The KV cache type and GPU layers of a load (its own, what an earlier ``load`` set,
        which reloads keep, ``[model_options.NAME]``'s or the settings'), and the room on each
        card: what the cache's card budgets leave for ``key`` (:meth:`read_cards`), when the
        runners' llama.cpp has a GPU backend (their hello); none otherwise (CPU only)."""
        before = self.dispatch.asked.get(key)  # kept by reloads
        kv = placement.option(
            next((j.kv_cache_type for j in jobs if j.kv_cache_type),
                 before.kv_cache_type if before else None),
            name, "kv_cache_type", self.settings)  # fmt: skip
        layers = placement.option(
            next((j.gpu_layers for j in jobs if j.gpu_layers is not None),
                 before.gpu_layers if before else None),
            name, "gpu_layers", self.settings)  # fmt: skip
        layers = None if layers is not None and layers < 0 else layers
        cards: tuple[placement.Gpu, ...] = ()
        if self.cuda_devices():  # read with gpu_layers 0 too: the placement says it had cards
            found = self.read_cards()
            rooms = self.cache.vram_available_for(key)
            cards = tuple(placement.Gpu(g.index, g.name, g.total, room)
                          for g, room in zip(found, rooms, strict=False))  # fmt: skip
        return placement.Where(str(kv), cards, layers, margin=0)

    def unified(self, key: ModelKey, name: str, jobs: list[Job]) -> bool:
        """Whether a load's sequences share one pool of cells: its own ``kv_unified``, what an
        earlier ``load`` set (reloads keep it), ``[model_options.NAME]``'s or the setting."""
        before = self.dispatch.asked.get(key)
        return bool(placement.option(
            next((j.kv_unified for j in jobs if j.kv_unified is not None),
                 before.kv_unified if before else None),
            name, "kv_unified", self.settings))  # fmt: skip

    def cuda_devices(self) -> int:
        """How many cards llama.cpp uses: what the last runner's hello counted; before any
        hello (the first load may be sent before it), every card NVML finds when a CUDA
        library sits beside llama_cpp, else none."""
        if self.pool.gpu_devices is not None:
            return self.pool.gpu_devices
        if self._cuda_built is None:
            from modeld.daemon import forkserver

            self._cuda_built = "cuda" in forkserver.gpu_backends()
        return 1 << 10 if self._cuda_built else 0

    def devices(self) -> tuple[str, list[dict[str, Any]]]:
        """(backend, devices) for ``stats``: ``CUDA`` or ``CPU`` (the runners' llama.cpp,
        from their hello, else from the libraries beside llama_cpp), and llama.cpp's devices,
        each card with NVML's total and free bytes and the cache's budget, its models'
        accounted (measured where known) and planned bytes there."""
        cards = self.read_cards() if self.cuda_devices() else ()
        used, planned = self.cache.vram_used(), self.cache.vram_planned()
        listed: list[dict[str, Any]] = [dict(d) for d in self.pool.devices] or [
            {"name": "CPU", "type": "cpu"}, *({"name": f"CUDA{i}", "description": g.name,
                                              "type": "gpu"} for i, g in enumerate(cards))]
        for d in listed:
            name = str(d.get("name", ""))
            i = int(name[4:]) if name.startswith("CUDA") and name[4:].isdigit() else -1
            if 0 <= i < len(cards):
                d.update(total_bytes=cards[i].total, free_bytes=cards[i].free,
                         budget_bytes=self.cache.vram_budgets[i], used_bytes=used[i],
                         estimate_bytes=planned[i])  # fmt: skip
        return ("CUDA" if self.cuda_devices() else "CPU"), listed

    def read_cards(self) -> tuple[GpuMemory, ...]:
        """Read the cards (NVML), charge each ready model what NVML says its runner holds
        on each, and give the cache each card's budget: its total less what other processes
        hold and the margin (:func:`modeld.model.placement.vram_budget`), at most ``vram_cap``."""
        from modeld.model import probe

        found = probe.gpu_memory()[: self.cuda_devices()]
        runners = self.pool.sup.runners
        entries = self.cache.entries()
        # the runners the cache charges (a spare's bytes, if any, count as another process's)
        pids = {runners[e.runner_id].pid for e in entries if e.runner_id in runners}
        named = all(g.processes is not None for g in found)
        for entry in entries:
            runner = runners.get(entry.runner_id)
            if named and runner is not None and entry.state is EntryState.READY:
                self.cache.update_vram(entry.key, tuple(dict(g.processes or ()).get(runner.pid, 0)
                                                        for g in found))  # fmt: skip
        cap = self.settings.vram_cap_bytes
        self.cache.set_vram_budgets(tuple(
            min(cap if cap else 1 << 62, placement.vram_budget(
                placement.Card(g.index, g.name, g.total, g.used,
                               None if g.processes is None else dict(g.processes)),
                pids, sum(e.vram_on(i) for e in entries)))
            for i, g in enumerate(found)))  # fmt: skip
        return found

    def admit(
        self, key: ModelKey, name: str, jobs: list[Job], waiting: Waiting | None
    ) -> Iterator[Evict | StartLoad]:
        """Start loading ``key`` for ``jobs`` (yields the evictions that makes room, then the
        :class:`StartLoad`), or make them wait, or fail them."""
        if not self._sized_with_measured_baseline(key, name, jobs, waiting):
            return
        if not self._workers_free(key, name, jobs, waiting):
            return
        # what an explicit load set stays set through reloads (a grown context, issue 36)
        before = self.dispatch.asked.get(key)
        requested = max((j.n_ctx for j in jobs if j.n_ctx is not None),
                        default=before.n_ctx if before else None)
        asked = next((j.parallel for j in jobs if j.parallel is not None),
                     before.parallel if before else None)
        rpc = rpc_of(jobs)
        # why the context is what it is, when the daemon chose it (a growth, a long first prompt)
        why = next((j.ctx_why for j in jobs if j.ctx_why and j.n_ctx == requested), None)
        try:
            info = self.model_info(key)
            if requested is None and key.mode == "generate" and not rpc:
                first = self.dispatch.growth.first_load(info, name, key, self.pool.baseline,
                                                        jobs, asked or 1)
                requested, why = first if first is not None else (None, None)
            proj = self.projector(key, name, jobs)
            size = sizing.size_for(
                info, key.mode, self.cache, key, self.pool.baseline, requested, self.settings,
                asked, offload=bool(rpc), where=self.where(key, name, jobs),
                projector=projector.memory_bytes(proj, info.embedding_length) if proj else 0,
                unified=self.unified(key, name, jobs),
            )  # fmt: skip
        except ModeldError as exc:
            self.fail(key, jobs, exc)
            return
        if why is not None and size.n_ctx == requested:
            size = dataclasses.replace(size, reason=why)
        plan = self.cache.plan(key, size.need_bytes, size.placement.vram)
        if plan.action == "refuse":
            self.fail(key, jobs, plan.error())
            return
        reason = plan.reason
        if plan.action == "evict":
            # Memory of models already on their way out is charged until their runners exit;
            # when it is enough, wait for it instead of evicting more models.
            unloading = sum(
                e.accounted_bytes for e in self.cache.entries() if e.state is EntryState.UNLOADING
            )
            # a slot, or a card's memory (what unloading models free is RAM's figure): evict
            for_slots = any(plan.victim_reason(v) in (EvictionReason.SLOTS, EvictionReason.VRAM)
                            for v in plan.victims)  # fmt: skip
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
                    yield Evict(victim, plan.victim_reason(victim))
            plan = self.cache.plan(key, size.need_bytes, size.placement.vram)
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
        yield StartLoad(key, name, jobs, info, size, proj.path if proj else None)

    def _sized_with_measured_baseline(
        self, key: ModelKey, name: str, jobs: list[Job], waiting: Waiting | None
    ) -> bool:
        """False (``jobs`` now wait, as an event-driven :class:`Waiting`) while the first
        measured runner baseline is about to arrive; sizing goes on once it has or after
        :data:`BASELINE_WAIT_S`. The wait does not count against ``queue_timeout_s``."""
        starting = self.pool.starting_baseline_runner()
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
            if not self.pool.baseline_measured:
                log.warning(
                    "no runner reported its baseline within %g s; sizing %s with the default %s",
                    BASELINE_WAIT_S, name, format_bytes(self.pool.baseline),
                )  # fmt: skip
        return True

    def _workers_free(
        self, key: ModelKey, name: str, jobs: list[Job], waiting: Waiting | None
    ) -> bool:
        """Whether the RPC workers ``jobs`` ask for are free. A worker leased to a loaded model
        fails the jobs at once (a worker serves one model; the other is not evicted for it); one
        still held by a runner on its way out (an unload, a reload) makes them wait for its exit,
        bounded by ``queue_timeout_s``."""
        held = self.leases.held(rpc_of(jobs) or ())
        if not held:
            return True
        for lease in held:
            slot = self.dispatch.slot_of(lease.runner_id)
            if slot is not None and slot.key != key:
                self.fail(key, jobs, leased_error(lease, name))
                return False
        if waiting is None:
            waiting = Waiting(key, name, jobs, self._clock() + self.settings.queue_timeout_s)
            self.waiting[key] = waiting
        waiting.reason = (
            f"waiting for runner {held[0].runner_id} to exit and free rpc worker {held[0].endpoint}"
        )
        log.info("%s %s", name, waiting.reason)
        return False

    def rpc_sizing(self, jobs: list[Job], n_ctx: int) -> RpcSizing:
        """A load's ``rpc_ctx_floor`` (how far its runner may lower ``n_ctx`` to fit its RPC
        workers: to ``ctx_floor`` when the context was chosen here, not at all when a job
        asked for it) and ``rpc_memory`` (the setting's cap on each worker)."""
        asked = any(j.n_ctx is not None for j in jobs)
        return RpcSizing(rpc_ctx_floor=None if asked else min(n_ctx, self.settings.ctx_floor),
                         rpc_memory=self.settings.rpc_worker_memory_bytes)  # fmt: skip

    def _moved_on(self, victim: ModelKey, jobs: list[Job]) -> bool:
        """True when the client that used ``victim`` last is the one now asking for another
        model: no follow-up for ``victim`` is coming from it, so the swap grace would only add
        delay (a client working through models in turn paid 0.25 s per switch; bench trace)."""
        slot = self.dispatch.slots.get(victim)
        last = slot.last_client if slot is not None else None
        return last is not None and all(job.client == last for job in jobs)

    def fail(self, key: ModelKey, jobs: list[Job], exc: ModeldError) -> None:
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
            self.dispatch.finish(job, err)

    def requeue(self, key: ModelKey, name: str, jobs: list[Job]) -> Iterator[Evict | StartLoad]:
        """Admit ``jobs`` of a model that is reloading, ahead of any that already wait for it."""
        waiting = self.waiting.get(key)
        if waiting is not None:
            waiting.jobs[:0] = jobs
        else:
            yield from self.admit(key, name, jobs, None)

    def remove(self, job: Job) -> None:
        """Take a cancelled ``job`` out of its waiting load (if it is in one)."""
        waiting = self.waiting.get(job.key)
        if waiting is not None and job in waiting.jobs:
            waiting.jobs.remove(job)
            if not waiting.jobs:
                del self.waiting[job.key]

    # ------------------------------------------------------------------ timers

    def time_out(self, now: float) -> None:
        """Fail the loads that waited ``queue_timeout_s`` for room (not those only waiting
        for the first measured baseline)."""
        for waiting in list(self.waiting.values()):
            if now >= waiting.deadline and not waiting.for_baseline:
                self.waiting.pop(waiting.key, None)
                for job in waiting.jobs:
                    self.dispatch.finish(
                        job,
                        RequestTimeoutError(
                            f"waited {self.settings.queue_timeout_s:g} s for room to load "
                            f"{waiting.name}: {waiting.reason}",
                            hint="retry later, unload other models, or raise the memory budget",
                            details={"retry_after_s": min(30.0, self.settings.queue_timeout_s)},
                        ),
                    )

    def retry(self) -> Iterator[Decision]:
        """Admit waiting loads in arrival order, after choosing which busy models drain."""
        self._choose_draining()
        for waiting in list(self.waiting.values()):
            if self.waiting.get(waiting.key) is not waiting:
                continue
            if not waiting.jobs:
                self.waiting.pop(waiting.key, None)
                continue
            slot = self.dispatch.slots.get(waiting.key)
            if slot is not None:  # its model is resident and no longer draining: rejoin it
                if slot.draining:
                    continue
                self.waiting.pop(waiting.key, None)
                for job in waiting.jobs:
                    self.dispatch.enqueue(slot, job)
                yield Pump(slot)
                continue
            yield from self.admit(waiting.key, waiting.name, waiting.jobs, waiting)

    def _choose_draining(self) -> None:
        """Fairness: the oldest waiting load may claim busy models' memory.

        Without this, a model that stays busy (a steady stream of requests) would starve a
        waiting one until its queue timeout. The least recently used busy, unpinned models
        whose memory the oldest waiting load needs stop taking new requests (those wait
        behind it); once their queued requests are done they are idle and get evicted.
        """
        slots = self.dispatch.slots
        was = {key for key, slot in slots.items() if slot.draining}
        for slot in slots.values():
            slot.draining = False
        oldest = next((w for w in self.waiting.values() if w.key not in slots), None)
        if oldest is None or oldest.need_bytes <= 0:
            return
        cache = self.cache
        for key in was:  # drained and now idle: stays put aside until the waiting load takes it
            entry = cache.get(key)
            if entry is not None and entry.evictable:
                slots[key].draining = True
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
        drain = []
        for entry in busy:
            if room >= oldest.need_bytes and slots_free >= 1:
                break
            victim = slots.get(entry.key)
            if victim is not None:
                drain.append(victim)
                room += entry.accounted_bytes
                slots_free += 1
        if room >= oldest.need_bytes and slots_free >= 1:
            for victim in drain:
                victim.draining = True


def rpc_of(jobs: list[Job]) -> tuple[str, ...] | None:
    """The RPC workers a load is for: the first job's that names any."""
    return next((j.rpc for j in jobs if j.rpc), None)

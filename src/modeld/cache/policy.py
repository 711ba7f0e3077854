"""Memory-aware LRU cache policy: admission, eviction, keep-alive, failure cool-down, statistics.

Pure logic with an injected clock; the daemon's event loop owns one :class:`CachePolicy` and is
the only caller, so nothing here locks. The policy never starts or stops processes: it tells the
daemon what to do (:meth:`CachePolicy.plan`, decided in :mod:`modeld.cache.plan`) and is told
what happened (``begin_load``, ``load_succeeded``, ``load_failed``, ``acquire``/``release``,
``remove``).

Invariant: the accounted bytes of all entries never exceed the budget through anything the policy
admits. The only way past it is a measured footprint larger than its estimate; then
:meth:`CachePolicy.rebalance` names idle victims, and nothing new is admitted until it fits again.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from modeld.cache.eviction import EvictionScorer
from modeld.cache.plan import Room, plan_load, plan_rebalance, replaceable
from modeld.cache.types import (
    DEFAULT_FAILURE_COOLDOWN_S,
    DEFAULT_KEEP_ALIVE_S,
    ERROR_SAMPLES,
    MAX_FAILURE_COOLDOWN_S,
    Action,
    CacheStats,
    Entry,
    EntryState,
    EvictionReason,
    FailureRecord,
    Mode,
    ModelKey,
    Plan,
    format_keep_alive,
    parse_keep_alive,
)
from modeld.errors import InsufficientMemoryError, ModeldError

__all__ = [
    "DEFAULT_FAILURE_COOLDOWN_S",
    "DEFAULT_KEEP_ALIVE_S",
    "MAX_FAILURE_COOLDOWN_S",
    "Action",
    "CachePolicy",
    "Entry",
    "EntryState",
    "EvictionReason",
    "Mode",
    "ModelKey",
    "Plan",
    "format_keep_alive",
    "parse_keep_alive",
]

class CachePolicy:
    """The cache's bookkeeping and decisions. See the module docstring for the invariant."""

    def __init__(
        self,
        budget_bytes: int,
        max_models: int,
        clock: Callable[[], float],
        failure_cooldown_s: float = DEFAULT_FAILURE_COOLDOWN_S,
        default_keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
        eviction: str = "lru",
    ) -> None:
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0")
        if max_models < 1:
            raise ValueError("max_models must be >= 1")
        self.budget_bytes = int(budget_bytes)
        self.max_models = int(max_models)
        self.failure_cooldown_s = float(failure_cooldown_s)
        self.default_keep_alive_s = float(default_keep_alive_s)
        self._clock = clock
        self._entries: dict[ModelKey, Entry] = {}
        self._unloading: dict[str, Entry] = {}  # runner_id -> entry still holding memory
        self._failures: dict[ModelKey, FailureRecord] = {}
        self._seq = 0
        self._stats = CacheStats(started_at=clock())
        self._scorer = EvictionScorer(eviction)  # victim order: "lru" or "cost" (eviction.py)
        self.vram_budgets: tuple[int, ...] = ()  # per card (set_vram_budgets); () no card

    # ---- queries -------------------------------------------------------------------------

    def now(self) -> float:
        return self._clock()

    def get(self, key: ModelKey) -> Entry | None:
        """The LOADING or READY entry for ``key`` (unloading ones are not returned)."""
        return self._entries.get(key)

    def entries(self) -> list[Entry]:
        """All entries holding memory, loading/ready first (oldest first), then unloading."""
        live = sorted(self._entries.values(), key=lambda e: e.seq)
        return live + sorted(self._unloading.values(), key=lambda e: e.seq)

    def find_runner(self, runner_id: str) -> Entry | None:
        """The entry served by ``runner_id`` (live or unloading)."""
        for entry in self._entries.values():
            if entry.runner_id == runner_id:
                return entry
        return self._unloading.get(runner_id)

    def used_bytes(self) -> int:
        """Accounted bytes of every entry, unloading ones included (their memory is not free)."""
        return sum(e.accounted_bytes for e in self.entries())

    def set_vram_budgets(self, budgets: tuple[int, ...]) -> None:
        """What modeld's models may hold on each card: its total less what other processes
        hold and a margin (:func:`modeld.model.placement.vram_budget`), read afresh before each
        plan."""
        self.vram_budgets = tuple(max(0, int(b)) for b in budgets)

    def vram_used(self) -> tuple[int, ...]:
        """Accounted bytes on each card, loading and unloading entries included: a load that
        has not allocated yet still counts, so loads planned together never share the room."""
        return tuple(self._room().used(1 + i) for i in range(len(self.vram_budgets)))

    def vram_planned(self) -> tuple[int, ...]:
        """The plans' bytes on each card (what :meth:`vram_used` charges before NVML says)."""
        return tuple(sum(e.vram[i] for e in self.entries() if i < len(e.vram))
                     for i in range(len(self.vram_budgets)))  # fmt: skip

    def vram_available_for(self, key: ModelKey) -> tuple[int, ...]:
        """Bytes a (re)load of ``key`` may plan with on each card: free + what evictable
        entries and its own idle entry hold there (the VRAM twin of
        :meth:`budget_available_for`); busy and pinned models' VRAM is never counted."""
        out = []
        for i, (budget, used) in enumerate(zip(self.vram_budgets, self.vram_used(), strict=True)):
            total = budget - used + sum(e.vram_on(i) for e in self._unloading.values())
            total += sum(e.vram_on(i) for e in self._entries.values()
                         if e.evictable or (e.key == key and replaceable(e)))  # fmt: skip
            out.append(max(0, total))
        return tuple(out)

    def free_bytes(self) -> int:
        return max(0, self.budget_bytes - self.used_bytes())

    def over_budget_bytes(self) -> int:
        """How far measured footprints pushed usage past the budget (0 normally)."""
        return max(0, self.used_bytes() - self.budget_bytes)

    def slots_used(self) -> int:
        """Entries that count against ``max_models``: LOADING and READY."""
        return len(self._entries)

    def lru_order(self) -> list[Entry]:
        """Evictable entries, least recently used first (ties: older entry first)."""
        return sorted(
            (e for e in self._entries.values() if e.evictable), key=lambda e: (e.last_used, e.seq)
        )

    def victim_order(self) -> list[Entry]:
        """Evictable entries, first victim first, by the eviction policy (LRU or cost-aware)."""
        return self._scorer.order(e for e in self._entries.values() if e.evictable)

    def budget_available_for(self, key: ModelKey) -> int:
        """Bytes a (re)load of ``key`` may plan with: free + every evictable entry.

        Includes the idle entry of ``key`` itself (a reload replaces it, pinned or not) and
        unloading entries (their memory is on its way back).
        """
        total = self.budget_bytes - self.used_bytes()
        total += sum(e.accounted_bytes for e in self._unloading.values())
        for entry in self._entries.values():
            if entry.evictable or (entry.key == key and replaceable(entry)):
                total += entry.accounted_bytes
        return max(0, total)

    def expired(self) -> list[Entry]:
        """Idle entries whose keep-alive has run out (pinned ones never expire)."""
        now = self._clock()
        return [
            e
            for e in self.entries()
            if e.state is EntryState.READY
            and not e.busy
            and not e.pinned
            and e.expires_at is not None
            and e.expires_at <= now
        ]

    def next_expiry(self) -> float | None:
        """The earliest finite expiry among idle entries (for the daemon's timer)."""
        times = [
            e.expires_at
            for e in self._entries.values()
            if e.expires_at is not None and math.isfinite(e.expires_at) and not e.pinned
        ]
        return min(times) if times else None

    def recent_failure(self, key: ModelKey) -> str | None:
        """The reason ``key`` failed to load if it is still cooling down, else None."""
        failure = self._failures.get(key)
        if failure is None or self._clock() >= failure.until:
            return None
        return failure.reason

    def failure_retry_in(self, key: ModelKey) -> float:
        """Seconds until ``key`` may be retried (0 when it is not cooling down)."""
        failure = self._failures.get(key)
        return 0.0 if failure is None else max(0.0, failure.until - self._clock())

    # ---- planning (the decisions themselves are in cache_plan) ---------------------------

    def _room(self) -> Room:
        return Room(
            self.budget_bytes, self.max_models, self._entries,
            list(self._unloading.values()), self.victim_order, self.vram_budgets,
        )  # fmt: skip

    def plan(self, key: ModelKey, need_bytes: int, need_vram: tuple[int, ...] = ()) -> Plan:
        """Decide how to make room for ``key`` (a new load, or a reload of its idle entry)
        needing ``need_bytes`` of RAM and ``need_vram`` on each card."""
        return plan_load(self._room(), key, need_bytes, self._failures.get(key), self._clock(),
                         need_vram)  # fmt: skip

    def rebalance(self) -> Plan | None:
        """Idle victims that bring usage back under the budget after a measured overshoot.

        Returns None when usage is within budget. The plan's action is ``evict`` when idle
        victims suffice, else ``wait`` (busy entries hold the rest; nothing is evicted).
        """
        return plan_rebalance(self._room())

    # ---- transitions ---------------------------------------------------------------------

    def begin_load(
        self,
        key: ModelKey,
        estimate_bytes: int,
        n_ctx: int,
        ctx_reason: str,
        runner_id: str,
        pinned: bool = False,
        keep_alive_s: float | None = None,
        vram: tuple[int, ...] = (),
        gpu_layers: int = 0,
    ) -> Entry:
        """Reserve ``estimate_bytes`` of RAM, ``vram`` on each card and a slot for a load that
        is starting (``gpu_layers`` of its layers on the cards).

        Raises :class:`InsufficientMemoryError` if that would break the budget or the slot
        limit (evict the plan's victims first) and :class:`ModeldError` if ``key`` is present.
        """
        if key in self._entries:
            raise ModeldError(f"{key.name} is already in the cache; remove it before reloading")
        plan = self.plan(key, estimate_bytes, vram)
        if plan.action != "admit":
            if plan.failure is not None:
                raise plan.error()
            raise InsufficientMemoryError(
                f"cannot start loading {key.name}: {plan.reason}",
                hint="evict the planned victims first",
                details={"action": plan.action, "victims": [v.name for v in plan.victims]},
            )
        now = self._clock()
        self._seq += 1
        entry = Entry(
            key=key, state=EntryState.LOADING, estimate_bytes=int(estimate_bytes), n_ctx=n_ctx,
            ctx_reason=ctx_reason, runner_id=runner_id, pinned=pinned,
            keep_alive_s=self.default_keep_alive_s if keep_alive_s is None else keep_alive_s,
            last_used=now, created_at=now, seq=self._seq, vram=tuple(int(b) for b in vram),
            gpu_layers=gpu_layers,
        )
        self._entries[key] = entry
        return entry

    def load_succeeded(
        self, key: ModelKey, measured_bytes: int | None, n_ctx: int, load_seconds: float,
        measured_vram: tuple[int, ...] | None = None,
    ) -> Entry:
        """Mark ``key`` READY and charge its measured footprint (RAM, and NVML's bytes on each
        card when it has layers there) from now on.

        If the measurement exceeds the estimate the next plan sees it; call :meth:`rebalance`
        to learn whether idle entries must go to get back under the budget.
        """
        entry = self._require(key)
        now = self._clock()
        entry.state = EntryState.READY
        entry.n_ctx = n_ctx
        entry.load_seconds = load_seconds
        entry.loaded_at = now
        if measured_bytes is not None:
            entry.measured_bytes = int(measured_bytes)
            if entry.estimate_bytes > 0:
                errors = self._stats.estimate_errors
                errors.append((measured_bytes - entry.estimate_bytes) / entry.estimate_bytes)
                del errors[:-ERROR_SAMPLES]
        if measured_vram is not None and sum(entry.vram) > 0:
            self.update_vram(key, measured_vram)
            errors = self._stats.vram_errors
            errors.append((sum(measured_vram) - sum(entry.vram)) / sum(entry.vram))
            del errors[:-ERROR_SAMPLES]
        if entry.in_flight == 0 and entry.queued == 0:
            entry.last_used = now
            entry.expires_at = now + entry.keep_alive_s
        self._stats.loads += 1
        self._stats.load_seconds_total += load_seconds
        self._scorer.record_load(key, load_seconds)
        self._failures.pop(key, None)
        return entry

    def update_measured(self, key: ModelKey, measured_bytes: int) -> None:
        """A fresh measurement of a ready entry (e.g. after its KV cache filled)."""
        self._require(key).measured_bytes = int(measured_bytes)

    def update_vram(self, key: ModelKey, measured: tuple[int, ...]) -> None:
        """NVML's bytes of a ready entry's runner on each card (they grow with the first
        batch: the compute buffers); an entry with no layers on the cards is left alone."""
        entry = self._entries.get(key)
        if entry is not None and sum(entry.vram) > 0:
            entry.vram_measured = tuple(int(b) for b in measured)

    def load_failed(
        self, key: ModelKey, reason: str, code: str | None = None, runner_alive: bool = False
    ) -> None:
        """Drop the loading entry and remember the failure so it is not retried in a loop.

        The cool-down doubles with each consecutive failure of the same key (capped at
        10 minutes); a failure 10 minutes past its cool-down is forgotten. A changed file is a
        new key and is tried at once. ``runner_alive``: its runner is still running (a load
        that timed out may still be reading the model), so the bytes stay charged until
        :meth:`unload_finished` says it exited, as for an eviction.
        """
        entry = self._entries.pop(key, None)
        if entry is not None and runner_alive:
            entry.state = EntryState.UNLOADING
            entry.expires_at = None
            self._unloading[entry.runner_id] = entry
        now = self._clock()
        # Forget failures long past their cool-down (bounded memory; the back-off restarts).
        for old_key in [k for k, f in self._failures.items()
                        if now - f.until > MAX_FAILURE_COOLDOWN_S]:
            del self._failures[old_key]
        prev = self._failures.get(key)
        count = (prev.count + 1) if prev is not None else 1
        cooldown = min(MAX_FAILURE_COOLDOWN_S, self.failure_cooldown_s * 2 ** (count - 1))
        self._failures[key] = FailureRecord(reason, code, now, count, now + cooldown)
        self._stats.load_failures += 1

    def clear_failure(self, key: ModelKey) -> None:
        """Forget a failure (an explicit ``modeld load`` retries at once)."""
        self._failures.pop(key, None)

    def acquire(self, key: ModelKey) -> Entry:
        """A request starts using ``key``: it becomes busy and cannot be evicted or expire."""
        entry = self._require(key)
        entry.in_flight += 1
        entry.use_count += 1
        self._scorer.record_use(key)
        entry.last_used = self._clock()
        entry.expires_at = None
        return entry

    def release(self, key: ModelKey, keep_alive_s: float | None = None) -> Entry:
        """A request finished. The keep-alive clock starts now, from the end of the request.

        ``keep_alive_s`` (from the request) replaces the entry's value and sticks for later
        requests, as in Ollama; None keeps the entry's current value.
        """
        entry = self._require(key)
        if entry.in_flight <= 0:
            raise ModeldError(f"release of {key.name} without a matching acquire")
        now = self._clock()
        entry.in_flight -= 1
        entry.last_used = now
        if keep_alive_s is not None:
            entry.keep_alive_s = keep_alive_s
        if not entry.busy:
            entry.expires_at = now + entry.keep_alive_s
        return entry

    def touch(self, key: ModelKey, keep_alive_s: float | None = None) -> Entry:
        """Refresh an idle entry's recency and expiry (a ``load`` of an already loaded model)."""
        entry = self._require(key)
        now = self._clock()
        entry.last_used = now
        if keep_alive_s is not None:
            entry.keep_alive_s = keep_alive_s
        if not entry.busy:
            entry.expires_at = now + entry.keep_alive_s
        return entry

    def enqueue(self, key: ModelKey) -> None:
        """A request is waiting for this entry (it is then not a victim)."""
        entry = self._require(key)
        entry.queued += 1
        entry.expires_at = None

    def dequeue(self, key: ModelKey) -> None:
        entry = self._require(key)
        entry.queued = max(0, entry.queued - 1)
        if not entry.busy and entry.state is EntryState.READY:
            entry.expires_at = self._clock() + entry.keep_alive_s

    def set_pinned(self, key: ModelKey, pinned: bool) -> Entry:
        entry = self._require(key)
        entry.pinned = pinned
        return entry

    def begin_unload(self, key: ModelKey, reason: EvictionReason) -> Entry:
        """Take ``key`` out of service while its runner exits; its bytes stay charged.

        The slot is freed at once (so a reload can begin) but the memory only when
        :meth:`unload_finished` is called with its runner id.
        """
        entry = self._entries.pop(key)
        entry.state = EntryState.UNLOADING
        entry.last_unload_reason = reason
        entry.expires_at = None
        self._unloading[entry.runner_id] = entry
        self._stats.evictions[reason.value] += 1
        return entry

    def unload_finished(self, runner_id: str) -> Entry | None:
        """The runner of an unloading entry has exited: its memory is free."""
        return self._unloading.pop(runner_id, None)

    def remove(self, key: ModelKey, reason: EvictionReason) -> Entry | None:
        """Drop ``key`` at once (memory counted as free now); None when it is not present."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        entry.last_unload_reason = reason
        entry.expires_at = None
        entry.state = EntryState.UNLOADING
        self._stats.evictions[reason.value] += 1
        return entry

    def _require(self, key: ModelKey) -> Entry:
        entry = self._entries.get(key)
        if entry is None:
            raise ModeldError(f"{key.name} is not in the cache")
        return entry

    # ---- statistics ----------------------------------------------------------------------

    def record_hit(self) -> None:
        self._stats.hits += 1

    def record_miss(self) -> None:
        self._stats.misses += 1

    def record_request(self) -> None:
        self._stats.requests += 1

    def record_tokens(self, completion: int, prompt: int = 0, *, drafted: int = 0,
                      accepted: int = 0) -> None:
        """A reply's tokens; ``drafted``/``accepted``: its prompt-lookup drafts checked and
        taken (each taken one is a decode step saved)."""
        self._stats.tokens += int(completion)
        self._stats.prompt_tokens += int(prompt)
        self._stats.draft_tokens += int(drafted)
        self._stats.draft_accepted += int(accepted)

    def stats(self) -> dict[str, object]:
        """JSON-safe counters for ``modeld stats``."""
        s = self._stats
        lookups = s.hits + s.misses
        errors = s.estimate_errors
        return {
            "hits": s.hits,
            "misses": s.misses,
            "hit_rate": (s.hits / lookups) if lookups else None,
            "loads": s.loads,
            "load_failures": s.load_failures,
            "load_seconds_total": s.load_seconds_total,
            "load_seconds_mean": (s.load_seconds_total / s.loads) if s.loads else None,
            "evictions": dict(s.evictions),
            "evictions_total": sum(s.evictions.values()),
            **_errors("estimate", errors),
            **_errors("vram_estimate", s.vram_errors),
            "tokens_generated": s.tokens,
            "prompt_tokens": s.prompt_tokens,
            "draft_tokens": s.draft_tokens,
            "draft_accepted": s.draft_accepted,
            "draft_acceptance": (s.draft_accepted / s.draft_tokens) if s.draft_tokens else None,
            "requests": s.requests,
            "uptime_s": self._clock() - s.started_at,
            "budget_bytes": self.budget_bytes,
            "used_bytes": self.used_bytes(),
            "max_models": self.max_models,
            "vram_budget_bytes": list(self.vram_budgets),
            "vram_used_bytes": list(self.vram_used()),
            "vram_estimate_bytes": list(self.vram_planned()),
            "eviction_policy": self._scorer.policy,
            "models_loaded": self.slots_used(),
            "cooling_down": [
                {"name": k.name, "path": k.path, "reason": f.reason, "count": f.count,
                 "retry_in_s": max(0.0, f.until - self._clock())}
                for k, f in self._failures.items() if f.until > self._clock()
            ],
        }


def _errors(name: str, errors: list[float]) -> dict[str, object]:
    """Estimate-vs-measured statistics: the samples, their mean and mean absolute error."""
    n = len(errors)
    return {f"{name}_error_samples": list(errors),
            f"{name}_error_mean": sum(errors) / n if n else None,
            f"{name}_abs_error_mean": sum(abs(x) for x in errors) / n if n else None}  # fmt: skip

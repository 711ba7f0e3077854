"""Room planning for the cache: how a load of a given size gets in (admit, evict which idle
models, wait for busy ones, or refuse), and which idle models go after a measured overshoot.

Pure functions of one snapshot of the cache (:class:`Room`): a decision is computed without
mutating anything, so the daemon can ask "what would it take" (``show``, admission retries)
as often as it likes. :class:`modeld.cache.policy.CachePolicy` builds the snapshot and applies the
result; its callers keep using ``CachePolicy.plan`` and ``CachePolicy.rebalance``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from modeld.cache.types import (
    Action,
    Entry,
    EntryState,
    EvictionReason,
    FailureRecord,
    ModelKey,
    Plan,
)
from modeld.errors import format_bytes


@dataclass(frozen=True)
class Room:
    """What planning needs to know about the cache at one moment."""

    budget_bytes: int
    max_models: int
    live: Mapping[ModelKey, Entry]  # loading and ready entries (each holds a slot)
    unloading: Sequence[Entry]  # evicted, still holding memory until their runners exit
    victim_order: Callable[[], list[Entry]]  # evictable entries, first victim first

    def used_bytes(self) -> int:
        """Accounted bytes of every entry, unloading ones included (their memory is not free)."""
        return sum(e.accounted_bytes for e in self.live.values()) + sum(
            e.accounted_bytes for e in self.unloading
        )


def replaceable(entry: Entry) -> bool:
    """An idle READY entry: a reload of its own key may replace it, pinned or not."""
    return entry.state is EntryState.READY and entry.in_flight == 0 and entry.queued == 0


def plan_load(
    room: Room, key: ModelKey, need_bytes: int, failure: FailureRecord | None, now: float
) -> Plan:
    """Decide how to make room for ``key`` (a new load, or a reload of its idle entry)."""
    need = int(need_bytes)
    budget, used = room.budget_bytes, room.used_bytes()
    free = max(0, budget - used)
    own = room.live.get(key)
    others = [e for e in room.live.values() if e is not own]
    pinned_bytes = sum(e.accounted_bytes for e in others if e.pinned)
    busy_bytes = sum(e.accounted_bytes for e in others if e.busy and not e.pinned)
    busy_bytes += sum(e.accounted_bytes for e in room.unloading)
    pinned_slots = sum(1 for e in others if e.pinned)

    def make(
        action: Action,
        reason: str,
        victims: list[Entry] | None = None,
        victim_reasons: list[EvictionReason] | None = None,
        failure: FailureRecord | None = None,
    ) -> Plan:
        chosen = victims or []
        return Plan(
            action=action, key=key, need_bytes=need, budget_bytes=budget, used_bytes=used,
            available_bytes=free, busy_bytes=busy_bytes, pinned_bytes=pinned_bytes,
            slots_used=len(room.live), max_models=room.max_models, reason=reason,
            reclaimable_bytes=sum(v.accounted_bytes for v in chosen),
            victims=tuple(v.key for v in chosen),
            victim_reasons=tuple(victim_reasons or ()),
            failure=failure.reason if failure else None,
            failure_code=failure.code if failure else None,
        )  # fmt: skip

    if failure is not None and now < failure.until:
        wait_s = failure.until - now
        return make(
            "refuse",
            f"{key.name} failed to load {failure.count} time(s), last: {failure.reason}; "
            f"not retrying for another {wait_s:.0f} s",
            failure=failure,
        )
    if need > budget - pinned_bytes or pinned_slots >= room.max_models:
        if pinned_slots >= room.max_models:
            why = f"all {room.max_models} model slots hold pinned models"
        else:
            why = (
                f"{key.name} needs {format_bytes(need)} but the budget is "
                f"{format_bytes(budget)}"
                + (f" with {format_bytes(pinned_bytes)} pinned" if pinned_bytes else "")
            )
        return make("refuse", why)
    if own is not None and not replaceable(own):
        return make("wait", f"{key.name} is {own.state.value} or busy; waiting to reload it")

    slots_free = room.max_models - len(room.live)
    space = budget - used  # negative after a measured overshoot: that debt is paid first
    victims: list[Entry] = []
    reasons: list[EvictionReason] = []
    if own is not None:  # a reload always replaces the idle entry of the same key
        victims.append(own)
        reasons.append(EvictionReason.RELOAD)
        space += own.accounted_bytes
        slots_free += 1
    for cand in room.victim_order():
        if space >= need and slots_free >= 1:
            break
        if cand is own:
            continue
        victims.append(cand)
        reasons.append(EvictionReason.MEMORY if space < need else EvictionReason.SLOTS)
        space += cand.accounted_bytes
        slots_free += 1
    if space >= need and slots_free >= 1:
        if not victims:
            return make("admit", f"{format_bytes(need)} fits in {format_bytes(free)} free")
        return make("evict", _evict_reason(key.name, victims, reasons, room.max_models),
                    victims=victims, victim_reasons=reasons)
    if space + busy_bytes >= need or slots_free < 1:
        return make(
            "wait",
            f"{key.name} needs {format_bytes(need)}; {format_bytes(max(0, space))} can be "
            "freed now "
            f"and {format_bytes(busy_bytes)} is held by busy models"
            + ("" if slots_free >= 1 else f" (all {room.max_models} slots busy)"),
        )
    return make(  # pragma: no cover - unreachable: the pinned check above covers it
        "refuse",
        f"{key.name} needs {format_bytes(need)} but at most {format_bytes(space + busy_bytes)}"
        " can ever be freed",
    )


def _evict_reason(name: str, victims: list[Entry], reasons: list[EvictionReason],
                  max_models: int) -> str:
    """Why these victims go, by their reasons: memory, a model slot (``max_models``), or the
    model's own reload; the same words ``show`` and the log print (issue 21: a slot eviction
    was described as freeing memory)."""
    whys: list[str] = []
    if EvictionReason.RELOAD in reasons:
        whys.append(f"to reload {name}")
    freed = sum(v.accounted_bytes for v, r in zip(victims, reasons, strict=True)
                if r is EvictionReason.MEMORY)
    if freed:
        whys.append(f"to free {format_bytes(freed)} for {name}")
    if EvictionReason.SLOTS in reasons:
        whys.append(f"because all {max_models} model slots are taken (max_models {max_models})")
    return f"evicting {len(victims)} idle model(s) " + " and ".join(whys)


def plan_rebalance(room: Room) -> Plan | None:
    """Idle victims that bring usage back under the budget after a measured overshoot.

    None when usage is within budget. The plan's action is ``evict`` when idle victims
    suffice, else ``wait`` (busy entries hold the rest; nothing is evicted).
    """
    used = room.used_bytes()
    over = max(0, used - room.budget_bytes)
    if over == 0:
        return None
    victims: list[Entry] = []
    freed = 0
    for cand in room.victim_order():
        if freed >= over:
            break
        victims.append(cand)
        freed += cand.accounted_bytes
    action: Action = "evict" if freed >= over else "wait"
    live = room.live.values()
    key = victims[0].key if victims else next(iter(room.live), ModelKey("", 0, 0))
    return Plan(
        action=action, key=key, need_bytes=over, budget_bytes=room.budget_bytes,
        used_bytes=used, available_bytes=0, reclaimable_bytes=freed,
        busy_bytes=sum(e.accounted_bytes for e in live if e.busy),
        pinned_bytes=sum(e.accounted_bytes for e in live if e.pinned),
        reason=f"measured usage is {format_bytes(over)} over the budget",
        victims=tuple(v.key for v in victims) if action == "evict" else (),
        victim_reasons=tuple(EvictionReason.MEMORY for _ in victims)
        if action == "evict" else (),
        slots_used=len(room.live), max_models=room.max_models,
    )  # fmt: skip

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
    """What planning needs to know about the cache at one moment. Memory comes in tiers: 0 is
    RAM (``budget_bytes``), 1 + i card i's VRAM (``vram_budgets[i]``); an entry holds bytes in
    each (:meth:`Entry.held`)."""

    budget_bytes: int
    max_models: int
    live: Mapping[ModelKey, Entry]  # loading and ready entries (each holds a slot)
    unloading: Sequence[Entry]  # evicted, still holding memory until their runners exit
    victim_order: Callable[[], list[Entry]]  # evictable entries, first victim first
    vram_budgets: tuple[int, ...] = ()  # per card: what modeld's models may hold there

    @property
    def tiers(self) -> int:
        return 1 + len(self.vram_budgets)

    def budget(self, tier: int) -> int:
        return self.budget_bytes if tier == 0 else self.vram_budgets[tier - 1]

    def used(self, tier: int) -> int:
        """Bytes held in ``tier`` by every entry, unloading ones included (not free yet)."""
        return sum(e.held(tier) for e in self.live.values()) + sum(
            e.held(tier) for e in self.unloading
        )

    def used_bytes(self) -> int:
        """Accounted bytes of every entry, unloading ones included (their memory is not free)."""
        return self.used(0)


def replaceable(entry: Entry) -> bool:
    """An idle READY entry: a reload of its own key may replace it, pinned or not."""
    return entry.state is EntryState.READY and entry.in_flight == 0 and entry.queued == 0


def plan_load(
    room: Room, key: ModelKey, need_bytes: int, failure: FailureRecord | None, now: float,
    need_vram: tuple[int, ...] = (),
) -> Plan:
    """Decide how to make room for ``key`` (a new load, or a reload of its idle entry) needing
    ``need_bytes`` of RAM and ``need_vram`` on each card. A victim is taken only when it frees
    a tier that is short (or a model slot): a model on the CPU is not evicted for VRAM."""
    need = int(need_bytes)
    tiers = range(room.tiers)
    needs = [need] + [int(need_vram[i]) if i < len(need_vram) else 0
                      for i in range(room.tiers - 1)]  # fmt: skip
    budget, used = room.budget_bytes, room.used_bytes()
    free = max(0, budget - used)
    own = room.live.get(key)
    others = [e for e in room.live.values() if e is not own]
    pinned = [sum(e.held(t) for e in others if e.pinned) for t in tiers]
    busy = [sum(e.held(t) for e in others if e.busy and not e.pinned)
            + sum(e.held(t) for e in room.unloading) for t in tiers]  # fmt: skip
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
            available_bytes=free, busy_bytes=busy[0], pinned_bytes=pinned[0],
            slots_used=len(room.live), max_models=room.max_models, reason=reason,
            reclaimable_bytes=sum(v.accounted_bytes for v in chosen),
            victims=tuple(v.key for v in chosen),
            victim_reasons=tuple(victim_reasons or ()),
            failure=failure.reason if failure else None,
            failure_code=failure.code if failure else None,
            need_vram=tuple(needs[1:]), vram_budgets=room.vram_budgets,
            vram_used=tuple(room.used(t) for t in tiers if t > 0),
        )  # fmt: skip

    if failure is not None and now < failure.until:
        wait_s = failure.until - now
        return make(
            "refuse",
            f"{key.name} failed to load {failure.count} time(s), last: {failure.reason}; "
            f"not retrying for another {wait_s:.0f} s",
            failure=failure,
        )
    if pinned_slots >= room.max_models:
        return make("refuse", f"all {room.max_models} model slots hold pinned models")
    for t in tiers:
        if needs[t] > room.budget(t) - pinned[t]:
            return make("refuse", f"{key.name} needs {format_bytes(needs[t])} "
                        + ("" if t == 0 else f"on GPU {t - 1} ") + "but the "
                        + ("budget" if t == 0 else "card's budget") + " is "
                        + f"{format_bytes(room.budget(t))}"
                        + (f" with {format_bytes(pinned[t])} pinned" if pinned[t] else ""))
    if own is not None and not replaceable(own):
        return make("wait", f"{key.name} is {own.state.value} or busy; waiting to reload it")

    slots_free = room.max_models - len(room.live)
    # negative after a measured overshoot: that debt is paid first
    space = [room.budget(t) - room.used(t) for t in tiers]
    victims: list[Entry] = []
    reasons: list[EvictionReason] = []

    def take(entry: Entry, why: EvictionReason) -> None:
        nonlocal slots_free
        victims.append(entry)
        reasons.append(why)
        for t in tiers:
            space[t] += entry.held(t)
        slots_free += 1

    def short() -> list[int]:
        return [t for t in tiers if space[t] < needs[t]]

    if own is not None:  # a reload always replaces the idle entry of the same key
        take(own, EvictionReason.RELOAD)
    for cand in room.victim_order():
        if not short() and slots_free >= 1:
            break
        if cand is own:
            continue
        frees = [t for t in short() if cand.held(t) > 0]
        if frees:
            take(cand, EvictionReason.MEMORY if frees[0] == 0 else EvictionReason.VRAM)
        elif slots_free < 1:
            take(cand, EvictionReason.SLOTS)
    lacking = short()
    if not lacking and slots_free >= 1:
        if not victims:
            return make("admit", f"{format_bytes(need)} fits in {format_bytes(free)} free"
                        + "".join(f" and {format_bytes(n)} on GPU {i}"
                                  for i, n in enumerate(needs[1:]) if n))  # fmt: skip
        return make("evict", _evict_reason(key.name, victims, reasons, room.max_models),
                    victims=victims, victim_reasons=reasons)
    if all(space[t] + busy[t] >= needs[t] for t in lacking) or slots_free < 1:
        t = lacking[0] if lacking else 0
        where = "" if t == 0 else f" on GPU {t - 1}"
        return make(
            "wait",
            f"{key.name} needs {format_bytes(needs[t])}{where}; "
            f"{format_bytes(max(0, space[t]))} can be freed now "
            f"and {format_bytes(busy[t])} is held by busy models"
            + ("" if slots_free >= 1 else f" (all {room.max_models} slots busy)"),
        )
    return make(  # pragma: no cover - unreachable: the pinned check above covers it
        "refuse",
        f"{key.name} needs {format_bytes(need)} but at most {format_bytes(space[0] + busy[0])}"
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
    on_cards = [v for v, r in zip(victims, reasons, strict=True) if r is EvictionReason.VRAM]
    if on_cards:
        vram = sum(sum(v.accounted_vram) for v in on_cards)
        whys.append(f"to free {format_bytes(vram)} of VRAM for {name}")
    if EvictionReason.SLOTS in reasons:
        whys.append(f"because all {max_models} model slots are taken (max_models {max_models})")
    return f"evicting {len(victims)} idle model(s) " + " and ".join(whys)


def plan_rebalance(room: Room) -> Plan | None:
    """Idle victims that bring every tier (RAM, each card) back under its budget after a
    measured overshoot; a victim is taken only when it holds bytes in a tier that is over.

    None when usage is within budget. The plan's action is ``evict`` when idle victims
    suffice, else ``wait`` (busy entries hold the rest; nothing is evicted).
    """
    tiers = range(room.tiers)
    over = [max(0, room.used(t) - room.budget(t)) for t in tiers]
    if not any(over):
        return None
    victims: list[Entry] = []
    reasons: list[EvictionReason] = []
    for cand in room.victim_order():
        lacking = [t for t in tiers if over[t] > 0 and cand.held(t) > 0]
        if not any(over[t] > 0 for t in tiers):
            break
        if not lacking:
            continue
        victims.append(cand)
        reasons.append(EvictionReason.MEMORY if lacking[0] == 0 else EvictionReason.VRAM)
        for t in tiers:
            over[t] = max(0, over[t] - cand.held(t))
    action: Action = "evict" if not any(over) else "wait"
    first = next(t for t in tiers if room.used(t) > room.budget(t))
    live = room.live.values()
    key = victims[0].key if victims else next(iter(room.live), ModelKey("", 0, 0))
    return Plan(
        action=action, key=key, need_bytes=room.used(first) - room.budget(first),
        budget_bytes=room.budget_bytes, used_bytes=room.used(0), available_bytes=0,
        reclaimable_bytes=sum(v.accounted_bytes for v in victims),
        busy_bytes=sum(e.accounted_bytes for e in live if e.busy),
        pinned_bytes=sum(e.accounted_bytes for e in live if e.pinned),
        reason=f"measured usage is {format_bytes(room.used(first) - room.budget(first))} over "
        f"the {'budget' if first == 0 else f'budget of GPU {first - 1}'}",
        victims=tuple(v.key for v in victims) if action == "evict" else (),
        victim_reasons=tuple(reasons) if action == "evict" else (),
        slots_used=len(room.live), max_models=room.max_models,
        vram_budgets=room.vram_budgets, vram_used=tuple(room.used(t) for t in tiers if t > 0),
    )  # fmt: skip

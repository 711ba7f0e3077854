"""The daemon's bridge to the memory and context policies: budget, n_ctx and bytes to reserve.

Kept apart from the scheduler so the rules for "how big may this load be" sit in one place:
the budget is ``min(memory_fraction x usable RAM, memory_cap)``; a load reserves the model's
estimate plus the runner process baseline; n_ctx is planned against what is free plus every
evictable entry (:meth:`CachePolicy.budget_available_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

from modeld.cache import CachePolicy, ModelKey
from modeld.config import Settings
from modeld.errors import InsufficientMemoryError, format_bytes
from modeld.modelinfo import ModelInfo

STEP = 256


@dataclass(frozen=True)
class Sizing:
    """What a load of one model will use."""

    n_ctx: int
    estimate_bytes: int  # the model in the runner (weights, KV, buffers)
    need_bytes: int  # estimate + runner baseline: what the cache reserves
    reason: str


def round_up(n: int, step: int = STEP) -> int:
    return max(step, -(-int(n) // step) * step)


def default_threads() -> int:
    """Runner threads when the config does not say: from the CPU affinity and cgroup quota."""
    from modeld import probe

    return max(1, int(probe.cpu_threads()))


def memory_budget(settings: Settings) -> tuple[int, int]:
    """(budget bytes, usable bytes): the fraction of usable RAM, capped by memory_cap."""
    from modeld import probe

    usable = int(probe.usable_memory().ram_bytes)
    budget = int(usable * settings.memory_fraction)
    if settings.memory_cap_bytes is not None:
        budget = min(budget, int(settings.memory_cap_bytes))
    return max(0, budget), usable


def _estimate(info: ModelInfo, n_ctx: int, mode: str) -> int:
    from modeld import memory

    return int(memory.estimate(info, n_ctx, mode="embed" if mode == "embed" else "generate").total)


def _choose(
    info: ModelInfo, mode: str, budget: int, requested: int | None, settings: Settings
) -> tuple[int, int, str]:
    """(n_ctx, estimate, reason) within ``budget`` model bytes, or InsufficientMemoryError."""
    from modeld import ctx

    choice = ctx.choose_context(
        info,
        budget,
        floor=settings.ctx_floor,
        ceiling=settings.ctx_ceiling,
        requested=requested,
        mode="embed" if mode == "embed" else "generate",
    )
    return int(choice.n_ctx), int(choice.estimate.total), str(choice.reason)


def size_for(
    info: ModelInfo,
    mode: str,
    cache: CachePolicy,
    key: ModelKey,
    baseline: int,
    requested: int | None,
    settings: Settings,
) -> Sizing:
    """The n_ctx and reservation for loading ``key`` now.

    Planned against free + evictable memory; when even the smallest context does not fit there
    but would fit once busy models finish, the smallest is returned (the cache plan then says
    "wait"). Raises InsufficientMemoryError when it can never fit.
    """
    available = cache.budget_available_for(key) - baseline
    try:
        n_ctx, est, reason = _choose(info, mode, available, requested, settings)
    except InsufficientMemoryError:
        pinned = sum(e.accounted_bytes for e in cache.entries() if e.pinned and e.key != key)
        whole = cache.budget_bytes - pinned - baseline
        try:
            n_ctx, est, reason = _choose(info, mode, whole, requested, settings)
        except InsufficientMemoryError as exc:
            exc.details.setdefault("budget_bytes", cache.budget_bytes)
            exc.details.setdefault("runner_baseline_bytes", baseline)
            exc.message = (
                f"{exc.message} (budget {format_bytes(cache.budget_bytes)}, runner baseline "
                f"{format_bytes(baseline)})"
            )
            raise
        small = round_up(requested) if requested else min(n_ctx, round_up(settings.ctx_floor))
        n_ctx, est = small, _estimate(info, small, mode)
        reason = f"smallest context while waiting for busy models ({reason})"
    return Sizing(n_ctx, est, est + baseline, reason)


def max_context(
    info: ModelInfo,
    mode: str,
    cache: CachePolicy,
    key: ModelKey,
    baseline: int,
    settings: Settings,
) -> int:
    """The largest n_ctx ``key`` could ever get in this budget (0 when nothing fits)."""
    pinned = sum(e.accounted_bytes for e in cache.entries() if e.pinned and e.key != key)
    budget = cache.budget_bytes - pinned - baseline
    limit = info.context_length or (1 << 20)
    lo, hi = 0, limit // STEP
    while lo < hi:  # binary search over multiples of 256
        mid = (lo + hi + 1) // 2
        if _estimate(info, mid * STEP, mode) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo * STEP

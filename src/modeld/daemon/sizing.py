"""The daemon's bridge to the memory and context policies: budget, n_ctx and bytes to reserve.

Kept apart from the scheduler so the rules for "how big may this load be" sit in one place:
the budget is ``min(memory_fraction x usable RAM, memory_cap)``; a load reserves the model's
estimate plus the runner process baseline and, in generate mode, its prompt cache
(``prompt_cache_mib``); n_ctx is planned against what is free plus every
evictable entry (:meth:`CachePolicy.budget_available_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

from modeld.cache.policy import CachePolicy, ModelKey
from modeld.config import Settings
from modeld.errors import (
    ContextExceededError,
    InsufficientMemoryError,
    InvalidModelError,
    ModelNotFoundError,
    format_bytes,
)
from modeld.modelinfo import ModelInfo
from modeld.runner.promptcache import PROMPT_CACHE_MIB

STEP = 256


@dataclass(frozen=True)
class Sizing:
    """What a load of one model will use."""

    n_ctx: int
    estimate_bytes: int  # the model in the runner (weights, KV, buffers)
    need_bytes: int  # estimate + prompt cache + runner baseline: what the cache reserves
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


def prompt_cache_bytes(mode: str, settings: Settings | None) -> int:
    """The prompt-state cache a runner of this mode keeps (generate mode only)."""
    if mode == "embed":
        return 0
    return settings.prompt_cache_bytes if settings is not None else PROMPT_CACHE_MIB << 20


def _estimate(info: ModelInfo, n_ctx: int, mode: str) -> int:
    from modeld import memory

    return int(memory.estimate(info, n_ctx, mode="embed" if mode == "embed" else "generate").total)


def breakdown(
    info: ModelInfo, n_ctx: int, mode: str, settings: Settings | None = None
) -> dict[str, object]:
    """The estimate's components (weights, KV cache, compute, prompt cache, ...) for ``show``;
    without ``settings`` the prompt cache is counted at its default size."""
    from modeld import memory

    kind: memory.Mode = "embed" if mode == "embed" else "generate"
    cache = prompt_cache_bytes(mode, settings)
    return memory.estimate(info, n_ctx, mode=kind, prompt_cache=cache).to_dict()


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
    extra = baseline + prompt_cache_bytes(mode, settings)  # reserved beside the model's estimate
    available = cache.budget_available_for(key) - extra
    try:
        n_ctx, est, reason = _choose(info, mode, available, requested, settings)
    except InsufficientMemoryError:
        pinned = sum(e.accounted_bytes for e in cache.entries() if e.pinned and e.key != key)
        whole = cache.budget_bytes - pinned - extra
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
    return Sizing(n_ctx, est, est + extra, reason)


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
    budget = cache.budget_bytes - pinned - baseline - prompt_cache_bytes(mode, settings)
    limit = info.context_length or (1 << 20)
    lo, hi = 0, limit // STEP
    while lo < hi:  # binary search over multiples of 256
        mid = (lo + hi + 1) // 2
        if _estimate(info, mid * STEP, mode) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo * STEP


def context_for_prompt(
    info: ModelInfo,
    name: str,
    key: ModelKey,
    cache: CachePolicy,
    baseline: int,
    settings: Settings,
    prompt_tokens: int,
    max_tokens: int,
) -> int:
    """The n_ctx to reload ``key`` with so a prompt of ``prompt_tokens`` fits (and room to
    answer, up to ``max_tokens`` or 1024), or ContextExceededError saying how many fit."""
    train = info.context_length or (1 << 20)
    if prompt_tokens + 1 > train:
        raise ContextExceededError(
            f"the prompt has {prompt_tokens} tokens but {name} was trained for {train} at most",
            hint="shorten the prompt",
            details={"prompt_tokens": prompt_tokens, "n_ctx_train": train},
        )
    fits = max_context(info, key.mode, cache, key, baseline, settings)
    if fits < prompt_tokens + 1:
        raise ContextExceededError(
            f"the prompt has {prompt_tokens} tokens but at most {fits} fit in the memory "
            f"budget for {name}",
            hint="shorten the prompt, unload other models, or raise the memory budget",
            details={"prompt_tokens": prompt_tokens, "n_ctx_max": fits},
        )
    want = round_up(min(train, prompt_tokens + min(max_tokens, 1024)))
    want = min(want, max(STEP, train - train % STEP), fits)
    return max(want, round_up(prompt_tokens + 1))


def read_info(path: str) -> ModelInfo:
    """The model's header (fast reader), with I/O errors mapped to modeld errors."""
    from modeld.gguf import read_model_info

    try:
        return read_model_info(path)
    except FileNotFoundError as exc:
        raise ModelNotFoundError(f"{path} does not exist", hint="check the path") from exc
    except OSError as exc:
        raise InvalidModelError(f"cannot read {path}: {exc}") from exc

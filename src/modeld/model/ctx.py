"""Dynamic context length: the largest n_ctx that fits the memory a model may use (pure).

The choice is the largest multiple of 256 in ``[floor, min(training context, ceiling)]`` whose
:func:`modeld.model.memory.estimate` fits ``budget_bytes`` — the model's own bytes, without the
runner baseline (the caller subtracts that). The estimate grows with n_ctx, so a binary search over
multiples of 256 finds it in a dozen estimates. A requested n_ctx (rounded up to 256) wins when
it fits; otherwise the error carries the numbers and the largest n_ctx that would fit.

Defaults: ``floor`` 2048 (or the training context when that is smaller) so a chat always has
room for a real prompt; ``ceiling`` 8192, moderate so several models fit side by side — the
daemon reloads with a larger context on demand when a prompt needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from modeld.errors import InsufficientMemoryError, format_bytes
from modeld.model import memory
from modeld.model.memory import MemoryEstimate
from modeld.model.modelinfo import ModelInfo

STEP = 256
DEFAULT_FLOOR = 2048
DEFAULT_CEILING = 8192

EstimateFn = Callable[..., MemoryEstimate]


@dataclass(frozen=True)
class ContextChoice:
    """The chosen n_ctx, its estimate, and why (shown by ``ps`` and ``show``)."""

    n_ctx: int
    estimate: MemoryEstimate
    reason: str

    @property
    def estimate_bytes(self) -> int:
        return self.estimate.total

    def to_dict(self) -> dict[str, object]:
        return {"n_ctx": self.n_ctx, "reason": self.reason, "estimate": self.estimate.to_dict()}


def round_up(n: int, step: int = STEP) -> int:
    """``n`` rounded up to a multiple of ``step`` (at least one step)."""
    return max(step, -(-int(n) // step) * step)


def round_down(n: int, step: int = STEP) -> int:
    """``n`` rounded down to a multiple of ``step`` (at least one step)."""
    return max(step, int(n) // step * step)


def cap_at_training(n_ctx: int, training: int) -> int:
    """A requested context past the training one (0: unknown) is capped at it: beyond it the
    model only degrades, at many times the memory."""
    return min(n_ctx, round_down(training)) if training > 0 else n_ctx


def largest_fitting(fits: Callable[[int], bool], lo: int, hi: int, step: int = STEP) -> int | None:
    """Largest multiple of ``step`` in [lo, hi] with ``fits`` true (monotone), else None."""
    a, b = round_up(lo, step) // step, hi // step
    if a > b or not fits(a * step):
        return None
    while a < b:  # invariant: fits(a*step); answer in [a, b]
        mid = (a + b + 1) // 2
        if fits(mid * step):
            a = mid
        else:
            b = mid - 1
    return a * step


def choose_context(
    info: ModelInfo,
    budget_bytes: int,
    *,
    floor: int = DEFAULT_FLOOR,
    ceiling: int = DEFAULT_CEILING,
    requested: int | None = None,
    estimate_fn: EstimateFn = memory.estimate,
    **estimate_kwargs: Any,
) -> ContextChoice:
    """Pick n_ctx for ``info`` within ``budget_bytes``; extra kwargs go to ``estimate_fn``.

    Raises InsufficientMemoryError (with ``needed``, ``available`` and ``largest_fitting``
    in its details) when the requested n_ctx, or even the floor, does not fit.
    """
    if floor <= 0 or ceiling <= 0:
        raise ValueError(f"floor and ceiling must be positive (got {floor}, {ceiling})")
    cache: dict[int, MemoryEstimate] = {}

    def est(n: int) -> MemoryEstimate:
        if n not in cache:
            cache[n] = estimate_fn(info, n, **estimate_kwargs)
        return cache[n]

    def fits(n: int) -> bool:
        return est(n).total <= budget_bytes

    training = info.context_length if info.context_length > 0 else None
    upper = round_down(min(training or ceiling, ceiling))
    lower = min(round_up(floor), upper)

    if requested is not None:
        if requested <= 0:
            raise ValueError(f"requested n_ctx must be positive, got {requested}")
        n = round_up(requested)
        reason = "requested"
        if training is not None and n > training:
            # issue 21: num_ctx 300000 loaded a 32k model at 4x its training; now with a note
            n = cap_at_training(n, training)
            reason = f"requested {requested}, capped at the training context {training}"
        if fits(n):
            return ContextChoice(n, est(n), reason)
        raise _too_big(info, n, est(n), budget_bytes, fits, what=f"the requested n_ctx {n}")

    if fits(upper):
        if training is not None and training <= ceiling:
            reason = f"training context {training}"
        else:
            reason = f"ceiling {upper} (config)"
        return ContextChoice(upper, est(upper), reason)
    best = largest_fitting(fits, lower, upper)
    if best is None:
        what = f"the minimum context {lower}"
        raise _too_big(info, lower, est(lower), budget_bytes, fits, what=what)
    reason = f"memory: {best} fits in {format_bytes(budget_bytes)} budget"
    return ContextChoice(best, est(best), reason)


def _too_big(
    info: ModelInfo,
    n_ctx: int,
    needed: MemoryEstimate,
    budget: int,
    fits: Callable[[int], bool],
    *,
    what: str,
) -> InsufficientMemoryError:
    largest = largest_fitting(fits, STEP, max(STEP, n_ctx - STEP))
    name = info.name or info.path
    msg = (
        f"{name}: {what} needs {format_bytes(needed.total)} but only "
        f"{format_bytes(max(0, budget))} is available"
    )
    if largest is None:
        msg += "; no context size fits"
        hint = "unload other models or raise the memory budget"
    else:
        msg += f"; the largest context that fits is {largest}"
        hint = f"use n_ctx {largest} or less, unload other models, or raise the memory budget"
    return InsufficientMemoryError(
        msg,
        hint=hint,
        details={
            "n_ctx": n_ctx,
            "needed": needed.total,
            "available": max(0, budget),
            "largest_fitting": largest,
        },
    )

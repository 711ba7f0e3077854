"""What the scheduler's parts decide, for the :class:`~modeld.daemon.scheduler.Scheduler` to do.

Admission (:mod:`.admission`) and dispatch (:mod:`.dispatch`) own their state and decide; they
do not call back into the scheduler. Where a decision needs the scheduler (a load to start, a
model to evict, a reload, a ``load`` request answered with its ``ps`` row, a slot to pump), they
yield it; the scheduler carries each out before the part goes on (their methods are generators,
so a decision is applied exactly where it was made: the next one is planned on the state it
left). A part's generator that nobody runs does nothing: call them through
:meth:`Scheduler.carry_out`.
"""

from __future__ import annotations

from dataclasses import dataclass

from modeld import sizing
from modeld.cache.policy import EvictionReason, ModelKey
from modeld.daemon.jobs import Job, Slot
from modeld.model.modelinfo import ModelInfo


@dataclass(frozen=True)
class StartLoad:
    """Admission said yes: a runner loads ``key`` at ``size`` and ``jobs`` queue on it."""

    key: ModelKey
    name: str
    jobs: list[Job]
    info: ModelInfo
    size: sizing.Sizing
    mmproj: str | None = None  # the image projector it loads with


@dataclass(frozen=True)
class Evict:
    """Take ``key`` out of service (its memory is freed when its runner has exited)."""

    key: ModelKey
    reason: EvictionReason


@dataclass(frozen=True)
class Reload:
    """``slot`` is idle and its next request needs another context or ``parallel``."""

    slot: Slot


@dataclass(frozen=True)
class AnswerLoad:
    """A ``load`` request reached its model, which is ready: reply with the model's row."""

    job: Job
    slot: Slot


@dataclass(frozen=True)
class Pump:
    """Requests joined ``slot``'s queue: send what its runner can take now."""

    slot: Slot


Decision = StartLoad | Evict | Reload | AnswerLoad | Pump

"""Data types of the cache policy: keys, entries, plans, reasons, keep-alive parsing.

Split from :mod:`modeld.cache.policy` (which re-exports everything here) to keep modules small.
Pure: no I/O beyond ``os.stat`` in :meth:`ModelKey.for_file`.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from modeld.errors import (
    ErrorCode,
    InsufficientMemoryError,
    InvalidRequestError,
    ModeldError,
    error_from_dict,
)
from modeld.model.memory import Mode as Mode  # re-exported: the key's mode

Action = Literal["admit", "evict", "wait", "refuse"]

DEFAULT_KEEP_ALIVE_S = 300.0
DEFAULT_FAILURE_COOLDOWN_S = 30.0
MAX_FAILURE_COOLDOWN_S = 600.0
ERROR_SAMPLES = 200  # estimate-vs-measured samples kept for stats


class EntryState(StrEnum):
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


class EvictionReason(StrEnum):
    """Why an entry left the cache; counted in stats and shown as ``last_unload_reason``."""

    MEMORY = "memory"
    VRAM = "vram"  # a card's memory (the tier that was short)
    SLOTS = "slots"
    KEEP_ALIVE = "keep_alive"
    EXPLICIT = "explicit"
    FILE_CHANGED = "file_changed"
    CRASH = "crash"
    RELOAD = "reload"
    SHUTDOWN = "shutdown"


#: The path each model file (device, inode) was first keyed by (:meth:`ModelKey.for_file`).
_FIRST_NAME: dict[tuple[int, int], str] = {}


@dataclass(frozen=True, order=True)
class ModelKey:
    """Identity of a loaded model. A file replaced on disk (size or mtime) is a new key."""

    path: str  # real (symlink-free, absolute) path
    size: int
    mtime_ns: int
    mode: Mode = "generate"

    @classmethod
    def for_file(cls, path: str | os.PathLike[str], mode: Mode = "generate") -> ModelKey:
        """The key for ``path`` as it is on disk now (raises OSError when it is missing). A
        file is one model whatever its names: a hard link to a file seen before (the same
        device and inode) gets the path it was first seen at, so it is not loaded twice."""
        real = os.path.realpath(os.fspath(path))
        st = os.stat(real)
        inode = (st.st_dev, st.st_ino)
        first = _FIRST_NAME.setdefault(inode, real)
        if first != real:
            try:
                again = os.stat(first)
            except OSError:
                again = None
            if again is not None and (again.st_dev, again.st_ino) == inode:
                real = first
            else:  # that name is gone or another file now: this one is the name
                _FIRST_NAME[inode] = real
        return cls(real, st.st_size, st.st_mtime_ns, mode)

    @property
    def name(self) -> str:
        """Display name: the file stem, with ``[embed]`` or ``[rerank]`` for those modes."""
        stem = os.path.basename(self.path)
        stem = stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
        return stem if self.mode == "generate" else f"{stem} [{self.mode}]"

    def is_current(self) -> bool:
        """False when the file was replaced or removed since the key was taken."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return st.st_size == self.size and st.st_mtime_ns == self.mtime_ns

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, "mtime_ns": self.mtime_ns, "mode": self.mode}


@dataclass
class Entry:
    """One model in the cache (mutable; owned by the policy, read by the daemon)."""

    key: ModelKey
    state: EntryState
    estimate_bytes: int
    n_ctx: int
    ctx_reason: str
    runner_id: str
    pinned: bool = False
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    measured_bytes: int | None = None
    in_flight: int = 0
    queued: int = 0
    expires_at: float | None = None  # None while loading or busy; math.inf = never by timer
    last_used: float = 0.0
    use_count: int = 0
    loaded_at: float | None = None
    load_seconds: float | None = None
    last_unload_reason: EvictionReason | None = None
    created_at: float = 0.0
    seq: int = 0  # insertion order; breaks LRU ties deterministically
    vram: tuple[int, ...] = ()  # planned bytes on each card (the CUDA context included)
    vram_measured: tuple[int, ...] | None = None  # NVML's bytes of its runner on each card
    gpu_layers: int = 0  # layers on the cards

    @property
    def accounted_bytes(self) -> int:
        """What the budget charges: the measured footprint once known, else the estimate."""
        return self.measured_bytes if self.measured_bytes is not None else self.estimate_bytes

    @property
    def accounted_vram(self) -> tuple[int, ...]:
        """What each card's budget charges: NVML's measure once known, else the plan."""
        return self.vram_measured if self.vram_measured is not None else self.vram

    def vram_on(self, card: int) -> int:
        """Bytes this entry holds on card ``card`` (0 when none)."""
        held = self.accounted_vram
        return held[card] if card < len(held) else 0

    def held(self, tier: int) -> int:
        """Bytes held in a tier: 0 is RAM, 1 + i card i's VRAM (the plan's tier numbers)."""
        return self.accounted_bytes if tier == 0 else self.vram_on(tier - 1)

    @property
    def busy(self) -> bool:
        """Loading, generating, or with requests queued for it: never a victim."""
        return self.state is EntryState.LOADING or self.in_flight > 0 or self.queued > 0

    @property
    def evictable(self) -> bool:
        """Idle, ready and not pinned: may be evicted to make room."""
        return self.state is EntryState.READY and not self.busy and not self.pinned

    def to_dict(self, now: float | None = None) -> dict[str, object]:
        """JSON-safe view for ``ps``; ``expires_in_s`` is relative to ``now`` when given."""
        expires_in: float | None = None
        if self.expires_at is not None and now is not None and math.isfinite(self.expires_at):
            expires_in = max(0.0, self.expires_at - now)
        return {
            "name": self.key.name,
            "key": self.key.to_dict(),
            "state": self.state.value,
            "estimate_bytes": self.estimate_bytes,
            "measured_bytes": self.measured_bytes,
            "accounted_bytes": self.accounted_bytes,
            "n_ctx": self.n_ctx,
            "ctx_reason": self.ctx_reason,
            "pinned": self.pinned,
            "in_flight": self.in_flight,
            "queued": self.queued,
            "keep_alive_s": None if math.isinf(self.keep_alive_s) else self.keep_alive_s,
            "expires_at": None if self.expires_at is None or math.isinf(self.expires_at)
            else self.expires_at,
            "expires_in_s": expires_in,
            "forever": math.isinf(self.keep_alive_s),
            "last_used": self.last_used,
            "use_count": self.use_count,
            "loaded_at": self.loaded_at,
            "load_seconds": self.load_seconds,
            "runner_id": self.runner_id,
            "vram_bytes": list(self.accounted_vram),
            "gpu_layers": self.gpu_layers,
            "last_unload_reason": self.last_unload_reason.value
            if self.last_unload_reason else None,
        }


@dataclass(frozen=True)
class Plan:
    """What to do to make room for ``key`` needing ``need_bytes``; computed without mutation.

    ``admit``: it fits now. ``evict``: remove ``victims`` (in order, with ``victim_reasons``)
    first. ``wait``: room can only come from busy, loading or unloading entries; retry when one
    of them changes. ``refuse``: it can never fit (or the key is cooling down after a failure);
    :meth:`error` gives the exception to send.
    """

    action: Action
    key: ModelKey
    need_bytes: int
    budget_bytes: int
    used_bytes: int
    available_bytes: int  # free right now (budget - used, never negative)
    reclaimable_bytes: int  # freed by the victims
    busy_bytes: int  # held by busy/loading/unloading entries (what waiting could free)
    pinned_bytes: int
    reason: str
    victims: tuple[ModelKey, ...] = ()
    victim_reasons: tuple[EvictionReason, ...] = ()
    slots_used: int = 0
    max_models: int = 0
    failure: str | None = None
    failure_code: str | None = None
    need_vram: tuple[int, ...] = ()  # per card
    vram_budgets: tuple[int, ...] = ()  # per card
    vram_used: tuple[int, ...] = ()  # per card, unloading entries included

    def victim_reason(self, key: ModelKey) -> EvictionReason:
        return self.victim_reasons[self.victims.index(key)]

    def error(self) -> ModeldError:
        """The error for a ``refuse`` (or a ``wait`` that timed out), with the numbers."""
        details: dict[str, object] = {
            "model": self.key.name,
            "need_bytes": self.need_bytes,
            "budget_bytes": self.budget_bytes,
            "used_bytes": self.used_bytes,
            "available_bytes": self.available_bytes,
            "busy_bytes": self.busy_bytes,
            "pinned_bytes": self.pinned_bytes,
            "slots_used": self.slots_used,
            "max_models": self.max_models,
        }
        if any(self.need_vram):
            details.update(need_vram=list(self.need_vram), vram_budgets=list(self.vram_budgets),
                           vram_used=list(self.vram_used))  # fmt: skip
        if self.failure is not None:
            err = error_from_dict(
                {"code": self.failure_code or ErrorCode.INVALID_MODEL.value,
                 "message": self.reason,
                 "hint": "fix or replace the file (a changed file is retried at once), "
                 "or wait for the cool-down to pass",
                 "details": details}
            )
            return err
        return InsufficientMemoryError(
            self.reason,
            hint="use a smaller n_ctx or model, unload or unpin other models "
            "(`modeld ps`, `modeld unload`), or raise the memory budget",
            details=details,
        )


_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)", re.IGNORECASE)
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_keep_alive(
    value: str | int | float | None, default: float | str = DEFAULT_KEEP_ALIVE_S
) -> float:
    """Seconds to keep a model after its last request ends, with Ollama's semantics.

    ``None`` or ``""`` → ``default`` (itself parsed); a bare number is seconds; durations like
    ``"30s"``, ``"5m"``, ``"1h30m"``, ``"500ms"``; ``0`` unloads as soon as idle; any negative
    value keeps the model until memory is needed (``math.inf``). Anything else raises
    :class:`InvalidRequestError`.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        if isinstance(default, str):
            return parse_keep_alive(default, DEFAULT_KEEP_ALIVE_S)
        value = default
    if isinstance(value, bool):
        raise _bad_keep_alive(value)
    seconds = float(value) if isinstance(value, int | float) else _parse_duration(str(value))
    if math.isnan(seconds):
        raise _bad_keep_alive(value)
    return math.inf if seconds < 0 else seconds


def _parse_duration(text: str) -> float:
    s = text.strip().lower()
    sign = 1.0
    if s.startswith("-"):
        sign, s = -1.0, s[1:].strip()
    elif s.startswith("+"):
        s = s[1:].strip()
    if s.startswith(("-", "+")):
        raise _bad_keep_alive(text)
    try:
        return sign * float(s)
    except ValueError:
        pass
    if s in ("inf", "forever", "never"):
        return -1.0
    pos, total = 0, 0.0
    for match in _DURATION_RE.finditer(s):
        if match.start() != pos:
            raise _bad_keep_alive(text)
        total += float(match.group(1)) * _UNIT_S[match.group(2).lower()]
        pos = match.end()
    if pos != len(s) or pos == 0:
        raise _bad_keep_alive(text)
    return sign * total


def _bad_keep_alive(value: object) -> InvalidRequestError:
    return InvalidRequestError(
        f"invalid keep_alive {value!r}",
        hint='use seconds (300), a duration ("30s", "5m", "1h30m"), 0 to unload when idle, '
        "or a negative value to keep the model until memory is needed",
        details={"keep_alive": str(value)},
    )


def format_keep_alive(seconds: float) -> str:
    """``300`` → ``"5m"``, ``inf`` → ``"forever"``; for messages and ``ps``."""
    if math.isinf(seconds):
        return "forever"
    if seconds <= 0:
        return "0s"
    out, rest = "", seconds
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if rest >= size:
            n = int(rest // size)
            out += f"{n}{unit}"
            rest -= n * size
    if rest > 0 or not out:
        out += f"{rest:g}s"
    return out


@dataclass
class FailureRecord:
    """A failed load of one key, kept for the cool-down."""

    reason: str
    code: str | None
    at: float
    count: int
    until: float


@dataclass
class CacheStats:
    """Counters behind ``CachePolicy.stats()``."""

    started_at: float
    hits: int = 0
    misses: int = 0
    loads: int = 0
    load_failures: int = 0
    load_seconds_total: float = 0.0
    tokens: int = 0
    prompt_tokens: int = 0
    draft_tokens: int = 0  # prompt-lookup drafts checked (runner/speculate.py)
    draft_accepted: int = 0  # and taken: decode steps saved
    requests: int = 0
    evictions: dict[str, int] = field(
        default_factory=lambda: {r.value: 0 for r in EvictionReason}
    )
    estimate_errors: list[float] = field(default_factory=list)  # (measured-estimate)/estimate
    vram_errors: list[float] = field(default_factory=list)  # the same for the cards (NVML)

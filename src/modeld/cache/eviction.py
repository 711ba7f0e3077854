"""Victim order for the cache: plain LRU, or cost-aware (popularity x reload cost / size).

Why: with skewed popularity, LRU evicts a popular model merely because a rarer one was used
last, and pays for reloading it soon after. On the benchmark's seeded Zipf trace with bursts
(3 models, room for 2) LRU makes about 1.35x the loads of the offline optimum (Belady) while a
popularity-aware order makes about 1.2x (bench/b_trace.py; docs/benchmarks.md). The cost-aware
order is GreedyDual-Size-Frequency's idea: keep what is requested often, slow to reload and
small; with exponential decay of the request counts (so the past fades) instead of GDSF's
inflation value, and counts kept across evictions (a model's popularity is not reset by
evicting it). Ties fall back to LRU.

Pure logic: counts advance per request served, not with wall time, so tests are exact.
"""

from __future__ import annotations

from collections.abc import Iterable

from modeld.cache.types import Entry, ModelKey
from modeld.model.memory import MiB

POLICIES: tuple[str, ...] = ("lru", "cost")
HALF_LIFE_REQUESTS = 100.0  # a request's weight halves after this many later requests
MAX_TRACKED = 256  # keys remembered (the least popular are forgotten first)
_MIN_LOAD_S = 0.01
#: What a reload costs beyond the load itself (evicting, waiting for the memory, dispatch):
#: measured 0.1-0.3 s per switch (bench trace). Without it, noise in the load time of
#: fast-loading models (0.04-0.09 s for the same file) outweighed their popularity.
RELOAD_OVERHEAD_S = 0.25


class EvictionScorer:
    """Per-model request rate and reload cost; orders evictable entries, first victim first."""

    def __init__(self, policy: str = "lru", half_life: float = HALF_LIFE_REQUESTS) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown eviction policy {policy!r} (use one of {POLICIES})")
        if half_life <= 0:
            raise ValueError("half_life must be > 0")
        self.policy = policy
        self.half_life = float(half_life)
        self._n = 0  # requests seen
        self._count: dict[ModelKey, tuple[float, int]] = {}  # key -> (count, at request n)
        self._load_s: dict[ModelKey, float] = {}

    def record_use(self, key: ModelKey) -> None:
        """A request for ``key`` started (counts decay by half every ``half_life`` requests)."""
        self._count[key] = (self.popularity(key) + 1.0, self._n)
        self._n += 1
        if len(self._count) > MAX_TRACKED:
            coldest = min(self._count, key=self.popularity)
            del self._count[coldest]
            self._load_s.pop(coldest, None)

    def record_load(self, key: ModelKey, seconds: float) -> None:
        """A load of ``key`` took ``seconds`` (smoothed: one slow load does not dominate)."""
        s = max(_MIN_LOAD_S, float(seconds))
        old = self._load_s.get(key)
        self._load_s[key] = s if old is None else 0.5 * old + 0.5 * s

    def popularity(self, key: ModelKey) -> float:
        count, at = self._count.get(key, (0.0, self._n))
        return float(count * 2.0 ** (-(self._n - at) / self.half_life))

    def reload_seconds(self, key: ModelKey) -> float:
        """The cost of evicting ``key`` and loading it again (smoothed load time + overhead)."""
        return RELOAD_OVERHEAD_S + self._load_s.get(key, _MIN_LOAD_S)

    def value(self, entry: Entry) -> float:
        """What keeping ``entry`` is worth per byte: requests x reload seconds / MiB held."""
        size_mib = max(1.0, entry.accounted_bytes / MiB)
        return self.popularity(entry.key) * self.reload_seconds(entry.key) / size_mib

    def order(self, entries: Iterable[Entry]) -> list[Entry]:
        """``entries`` in eviction order (LRU: least recently used first; cost: least value)."""
        if self.policy == "lru":
            return sorted(entries, key=lambda e: (e.last_used, e.seq))
        return sorted(entries, key=lambda e: (self.value(e), e.last_used, e.seq))

"""Eviction order (modeld.cache.eviction) and its use by the cache policy: pure, fake clock."""

from __future__ import annotations

import random

import pytest

from modeld.cache.eviction import MAX_TRACKED, RELOAD_OVERHEAD_S, EvictionScorer
from modeld.cache.policy import CachePolicy, EntryState, ModelKey
from modeld.cache.types import Entry

MiB = 1 << 20


def key(name: str) -> ModelKey:
    return ModelKey(f"/m/{name}.gguf", 1, 1)


def entry(name: str, last_used: float, size: int = 100 * MiB, seq: int = 0) -> Entry:
    return Entry(key(name), EntryState.READY, size, 512, "", name, last_used=last_used, seq=seq)


def test_lru_orders_by_last_use() -> None:
    s = EvictionScorer("lru")
    for _ in range(10):
        s.record_use(key("a"))
    order = s.order([entry("a", 1.0), entry("b", 2.0)])
    assert [e.key for e in order] == [key("a"), key("b")]  # popularity is ignored


def test_cost_keeps_the_popular_model_even_if_used_longer_ago() -> None:
    s = EvictionScorer("cost")
    for _ in range(10):
        s.record_use(key("a"))
    s.record_use(key("b"))
    for k in ("a", "b"):
        s.record_load(key(k), 0.5)
    order = s.order([entry("a", 1.0), entry("b", 2.0)])
    assert [e.key for e in order] == [key("b"), key("a")]


def test_cost_weighs_reload_time_and_size() -> None:
    s = EvictionScorer("cost")
    for k in ("slow", "fast", "big", "small"):
        s.record_use(key(k))
    s.record_load(key("slow"), 4.0)
    s.record_load(key("fast"), 0.5)
    first = s.order([entry("slow", 1.0), entry("fast", 2.0)])[0]
    assert first.key == key("fast")  # cheap to reload: evict it first
    s.record_load(key("big"), 1.0)
    s.record_load(key("small"), 1.0)
    first = s.order([entry("big", 2.0, size=800 * MiB), entry("small", 1.0, size=100 * MiB)])[0]
    assert first.key == key("big")  # frees the most memory per unit of value


def test_ties_fall_back_to_lru() -> None:
    s = EvictionScorer("cost")
    order = s.order([entry("new", 5.0, seq=2), entry("old", 1.0, seq=1)])
    assert [e.key for e in order] == [key("old"), key("new")]


def test_counts_decay_with_later_requests() -> None:
    s = EvictionScorer("cost", half_life=10)
    for _ in range(8):
        s.record_use(key("past"))
    assert s.popularity(key("past")) == pytest.approx(sum(2 ** (-i / 10) for i in range(1, 9)))
    for _ in range(40):  # four half-lives of requests for another model
        s.record_use(key("now"))
    assert s.popularity(key("past")) < s.popularity(key("now")) / 4
    assert s.popularity(key("never")) == 0.0


def test_load_cost_is_smoothed_and_memory_is_bounded() -> None:
    s = EvictionScorer("cost")
    s.record_load(key("a"), 1.0)
    s.record_load(key("a"), 3.0)
    assert s.reload_seconds(key("a")) == pytest.approx(2.0 + RELOAD_OVERHEAD_S)
    for i in range(MAX_TRACKED + 50):
        s.record_use(key(f"m{i}"))
    assert len(s._count) <= MAX_TRACKED


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="eviction policy"):
        EvictionScorer("fifo")
    with pytest.raises(ValueError, match="eviction policy"):
        CachePolicy(1000, 3, lambda: 0.0, eviction="mru")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _serve(policy: CachePolicy, clock: Clock, k: ModelKey, size: int) -> bool:
    """One request for ``k`` through the policy; True when it needed a load."""
    clock.t += 1.0
    loaded = policy.get(k) is None
    if loaded:
        plan = policy.plan(k, size)
        for victim in plan.victims:
            policy.remove(victim, plan.victim_reason(victim))
        policy.begin_load(k, size, 512, "test", k.path)
        policy.load_succeeded(k, size, 512, 0.25)
    policy.acquire(k)
    clock.t += 0.5
    policy.release(k)
    return loaded


def _zipf_bursts(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < n:
        m = rng.choices(range(3), [1.0, 1 / 2, 1 / 3])[0]
        out.extend([m] * min(n - len(out), 1 + int(rng.expovariate(1 / 3))))
    return out


def test_policy_in_the_cache_plan() -> None:
    """Room for two of three: the cost policy evicts the rarely used model, LRU the older one."""
    for name, expected in (("cost", "rare"), ("lru", "popular")):
        clock = Clock()
        policy = CachePolicy(250 * MiB, 3, clock, eviction=name)
        for _ in range(5):
            _serve(policy, clock, key("popular"), 100 * MiB)
        _serve(policy, clock, key("rare"), 100 * MiB)
        plan = policy.plan(key("third"), 100 * MiB)
        assert plan.action == "evict" and plan.victims == (key(expected),), name
        assert policy.stats()["eviction_policy"] == name


def test_noisy_load_times_do_not_outweigh_popularity() -> None:
    """Same model size, load times 0.04 vs 0.09 s (noise): the popular model is kept."""
    s = EvictionScorer("cost")
    for _ in range(15):
        s.record_use(key("popular"))
    for _ in range(10):
        s.record_use(key("rare"))
    s.record_load(key("popular"), 0.04)
    s.record_load(key("rare"), 0.09)
    assert s.order([entry("popular", 1.0), entry("rare", 2.0)])[0].key == key("rare")


def test_cost_policy_makes_fewer_loads_on_a_skewed_trace() -> None:
    """The reason for the policy (bench/b_trace.py measures it with real processes)."""
    keys = [key(f"m{i}") for i in range(3)]
    loads = {}
    for name in ("lru", "cost"):
        total = 0
        for seed in range(5):
            clock = Clock()
            policy = CachePolicy(250 * MiB, 3, clock, eviction=name)
            total += sum(_serve(policy, clock, keys[m], 100 * MiB) for m in _zipf_bursts(seed, 300))
        loads[name] = total
    assert loads["cost"] < loads["lru"] * 0.95, loads

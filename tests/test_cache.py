"""Cache policy: LRU admission, busy/pinned safety, keep-alive, cool-down, accounting, stats.

Pure logic with a fake clock; the randomized test drives thousands of operations the way the
daemon does and checks the budget invariant after each.
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from modeld.cache.policy import (
    CachePolicy,
    Entry,
    EntryState,
    EvictionReason,
    ModelKey,
    Plan,
    format_keep_alive,
    parse_keep_alive,
)
from modeld.errors import (
    ErrorCode,
    InsufficientMemoryError,
    InvalidModelError,
    InvalidRequestError,
    ModeldError,
)

MB = 1_000_000


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def key(name: str, mode: str = "generate", mtime: int = 0) -> ModelKey:
    return ModelKey(f"/models/{name}.gguf", 1234, mtime, mode)  # type: ignore[arg-type]


def make(budget: int = 100, max_models: int = 3, **kw: float) -> tuple[CachePolicy, FakeClock]:
    clock = FakeClock()
    return CachePolicy(budget, max_models, clock, **kw), clock


def load(
    policy: CachePolicy, name: str, size: int, measured: int | None = None, **kw: object
) -> ModelKey:
    k = key(name)
    policy.begin_load(k, size, 2048, "test", f"r-{name}", **kw)  # type: ignore[arg-type]
    policy.load_succeeded(k, size if measured is None else measured, 2048, 0.5)
    return k


def apply(policy: CachePolicy, plan: Plan) -> None:
    """What the daemon does with an ``evict`` plan."""
    for victim in plan.victims:
        policy.remove(victim, plan.victim_reason(victim))


def snapshot(policy: CachePolicy) -> list[dict[str, object]]:
    return [e.to_dict() for e in policy.entries()]


# ---- keep-alive parsing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("2m30s", 150.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("10", 10.0),
        (10, 10.0),
        (2.5, 2.5),
        (0, 0.0),
        ("0", 0.0),
        ("0s", 0.0),
        (-1, math.inf),
        ("-1", math.inf),
        ("-5m", math.inf),
        (" 5M ", 300.0),
    ],
)
def test_parse_keep_alive(value: str | int | float, expected: float) -> None:
    assert parse_keep_alive(value) == expected


@pytest.mark.parametrize(
    ("value", "default", "expected"),
    [(None, 300.0, 300.0), ("", 42.0, 42.0), (None, "10m", 600.0), (None, -1, math.inf)],
)
def test_parse_keep_alive_default(value: str | None, default: float | str, expected: float) -> None:
    assert parse_keep_alive(value, default) == expected


@pytest.mark.parametrize(
    "value", ["abc", "5x", "m5", "5m junk", "1h-30m", "nan", float("nan"), True, "5 m m", "--5"]
)
def test_parse_keep_alive_invalid(value: object) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_keep_alive(value)  # type: ignore[arg-type]
    assert "keep_alive" in info.value.message
    assert info.value.code is ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(300.0, "5m"), (5400.0, "1h30m"), (math.inf, "forever"), (0.0, "0s"), (90.5, "1m30.5s")],
)
def test_format_keep_alive(seconds: float, text: str) -> None:
    assert format_keep_alive(seconds) == text
    assert parse_keep_alive(text) == seconds


# ---- model keys -----------------------------------------------------------------------------


def test_model_key_changes_when_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 100)
    link = tmp_path / "link.gguf"
    link.symlink_to(path)
    k1 = ModelKey.for_file(link)
    assert k1.path == str(path.resolve()) and k1.size == 104 and k1.is_current()
    assert ModelKey.for_file(path, "embed") != k1
    assert k1.name == "m" and ModelKey.for_file(path, "embed").name == "m [embed]"
    path.write_bytes(b"GGUF" + b"\0" * 200)
    os.utime(path, ns=(k1.mtime_ns + 10**9, k1.mtime_ns + 10**9))
    k2 = ModelKey.for_file(path)
    assert k2 != k1 and not k1.is_current() and k2.is_current()
    path.unlink()
    assert not k2.is_current()


# ---- admission and eviction (table-driven) ----------------------------------------------------


@dataclass
class Case:
    name: str
    setup: list[tuple[str, int, str]]  # (model, bytes, flags) loaded in this order
    need: tuple[str, int]
    action: str
    victims: list[str] = field(default_factory=list)
    reasons: list[EvictionReason] = field(default_factory=list)
    budget: int = 100
    max_models: int = 3


CASES = [
    Case("fits", [("a", 30, "")], ("new", 50), "admit"),
    Case("exactly fits", [("a", 30, "")], ("new", 70), "admit"),
    Case("lru victim", [("a", 40, ""), ("b", 40, "")], ("new", 40), "evict", ["a"],
         [EvictionReason.MEMORY]),
    Case("recently used is kept", [("a", 40, "used"), ("b", 40, "")], ("new", 40), "evict",
         ["b"]),
    Case("several victims in lru order", [("a", 30, ""), ("b", 30, ""), ("c", 30, "")],
         ("new", 65), "evict", ["a", "b"]),
    Case("busy entry skipped", [("a", 40, "busy"), ("b", 40, "")], ("new", 40), "evict", ["b"]),
    Case("queued entry skipped", [("a", 40, "queued"), ("b", 40, "")], ("new", 40), "evict",
         ["b"]),
    Case("pinned entry skipped", [("a", 40, "pinned"), ("b", 40, "")], ("new", 40), "evict",
         ["b"]),
    Case("wait for busy", [("a", 60, "busy"), ("b", 30, "")], ("new", 60), "wait"),
    Case("wait for loading", [("a", 60, "loading")], ("new", 60), "wait"),
    Case("wait for unloading", [("a", 60, "unloading")], ("new", 60), "wait"),
    Case("refuse larger than budget", [], ("new", 101), "refuse"),
    Case("refuse with busy too", [("a", 60, "busy")], ("new", 101), "refuse"),
    Case("refuse because of pinned", [("a", 60, "pinned"), ("b", 10, "")], ("new", 50),
         "refuse"),
    Case("slot limit evicts lru", [("a", 10, ""), ("b", 10, "")], ("new", 10), "evict", ["a"],
         [EvictionReason.SLOTS], max_models=2),
    Case("slot limit waits for busy", [("a", 10, "busy"), ("b", 10, "busy")], ("new", 10),
         "wait", max_models=2),
    Case("slot limit refuses when all pinned", [("a", 10, "pinned")], ("new", 10), "refuse",
         max_models=1),
    Case("memory then slot", [("a", 50, ""), ("b", 10, ""), ("c", 10, "")], ("new", 60),
         "evict", ["a"], [EvictionReason.MEMORY], max_models=3),
    Case("reload replaces own idle entry", [("new", 30, ""), ("a", 30, "")], ("new", 60),
         "evict", ["new"], [EvictionReason.RELOAD]),
    Case("reload of pinned own entry", [("new", 30, "pinned")], ("new", 90), "evict", ["new"],
         [EvictionReason.RELOAD]),
    Case("reload plus lru", [("a", 30, ""), ("new", 30, ""), ("b", 30, "")], ("new", 70),
         "evict", ["new", "a"], [EvictionReason.RELOAD, EvictionReason.MEMORY]),
    Case("reload waits for own busy entry", [("new", 30, "busy")], ("new", 40), "wait"),
    Case("zero budget refuses", [], ("new", 1), "refuse", budget=0),
]


def build(case: Case) -> tuple[CachePolicy, FakeClock]:
    policy, clock = make(case.budget, case.max_models)
    for name, size, flags in case.setup:
        clock.advance(1)
        k = key(name)
        policy.begin_load(k, size, 2048, "test", f"r-{name}", pinned="pinned" in flags)
        if "loading" in flags:
            continue
        policy.load_succeeded(k, size, 2048, 0.1)
        if "busy" in flags:
            policy.acquire(k)
        if "queued" in flags:
            policy.enqueue(k)
        if "unloading" in flags:
            policy.begin_unload(k, EvictionReason.EXPLICIT)
    for name, _, flags in case.setup:  # "used" = touched after everything else was loaded
        if "used" in flags:
            clock.advance(1)
            policy.acquire(key(name))
            policy.release(key(name))
    return policy, clock


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plan(case: Case) -> None:
    policy, _ = build(case)
    before = snapshot(policy)
    plan = policy.plan(key(case.need[0]), case.need[1])
    assert snapshot(policy) == before, "plan() must not mutate"
    assert plan.action == case.action, plan.reason
    assert [v.path for v in plan.victims] == [key(n).path for n in case.victims]
    if case.reasons:
        assert list(plan.victim_reasons) == case.reasons
    assert plan.need_bytes == case.need[1] and plan.budget_bytes == case.budget
    if plan.action in ("wait", "refuse", "admit"):
        assert plan.victims == () and plan.reclaimable_bytes == 0
    if plan.action == "evict":
        apply(policy, plan)
        after = policy.plan(key(case.need[0]), case.need[1])
        assert after.action == "admit", "an evict plan must be sufficient"
        policy.begin_load(key(case.need[0]), case.need[1], 2048, "t", "r-new")
        assert policy.used_bytes() <= case.budget
        assert policy.slots_used() <= case.max_models


def test_refusal_names_the_numbers_and_evicts_nothing() -> None:
    policy, _ = make(budget=1000 * MB)
    a = load(policy, "a", 300 * MB)
    policy.set_pinned(a, True)
    load(policy, "b", 200 * MB)
    before = snapshot(policy)
    plan = policy.plan(key("huge"), 800 * MB)
    assert plan.action == "refuse" and plan.victims == ()
    assert snapshot(policy) == before
    err = plan.error()
    assert isinstance(err, InsufficientMemoryError)
    assert "huge" in err.message and "762.9 MiB" in err.message and "286.1 MiB" in err.message
    assert err.details["need_bytes"] == 800 * MB and err.details["pinned_bytes"] == 300 * MB
    assert err.hint
    with pytest.raises(InsufficientMemoryError):
        policy.begin_load(key("huge"), 800 * MB, 2048, "t", "r")
    assert snapshot(policy) == before


def test_begin_load_guards_the_budget_and_duplicates() -> None:
    policy, _ = make(budget=100)
    a = load(policy, "a", 60)
    with pytest.raises(InsufficientMemoryError) as info:
        policy.begin_load(key("b"), 50, 2048, "t", "r-b")
    assert info.value.details["victims"] == ["a"]
    with pytest.raises(ModeldError, match="already in the cache"):
        policy.begin_load(a, 10, 2048, "t", "r-a2")
    assert policy.used_bytes() == 60


def test_budget_available_for_counts_free_and_evictable_only() -> None:
    policy, _ = make(budget=1000)
    a = load(policy, "a", 100)
    b = load(policy, "b", 200)
    load(policy, "c", 300, pinned=True)
    policy.acquire(b)
    assert policy.budget_available_for(key("new")) == 400 + 100
    assert policy.budget_available_for(a) == 500  # own idle entry is already in "evictable"
    assert policy.budget_available_for(b) == 500  # own busy entry cannot be replaced now
    policy.release(b)
    assert policy.budget_available_for(b) == 700
    c = key("c")
    assert policy.budget_available_for(c) == 700 + 300  # reload of a pinned model replaces it


def test_wait_turns_into_evict_when_busy_entry_is_released() -> None:
    policy, clock = make(budget=100)
    a = load(policy, "a", 70)
    policy.acquire(a)
    assert policy.plan(key("b"), 50).action == "wait"
    clock.advance(5)
    policy.release(a)
    plan = policy.plan(key("b"), 50)
    assert plan.action == "evict" and plan.victims == (a,)


def test_unloading_entry_holds_memory_until_runner_exits() -> None:
    policy, _ = make(budget=100, max_models=1)
    a = load(policy, "a", 80)
    entry = policy.begin_unload(a, EvictionReason.EXPLICIT)
    assert entry.state is EntryState.UNLOADING and policy.get(a) is None
    assert policy.used_bytes() == 80 and policy.slots_used() == 0
    assert policy.plan(key("b"), 50).action == "wait"
    assert policy.plan(key("c"), 20).action == "admit"
    assert policy.find_runner("r-a") is entry
    assert policy.unload_finished("r-a") is entry
    assert policy.used_bytes() == 0 and policy.plan(key("b"), 50).action == "admit"
    assert policy.unload_finished("r-a") is None


# ---- keep-alive ---------------------------------------------------------------------------


def test_keep_alive_runs_from_the_end_of_the_last_request() -> None:
    policy, clock = make()
    a = load(policy, "a", 10)
    policy.acquire(a)
    clock.advance(100)  # a long generation
    assert policy.expired() == []
    policy.release(a, 30.0)
    clock.advance(29.9)
    assert policy.expired() == []
    clock.advance(0.1)
    assert [e.key for e in policy.expired()] == [a]
    assert policy.next_expiry() == clock.t


@pytest.mark.parametrize(
    ("keep_alive", "advance", "expired"),
    [
        (0.0, 0.0, True),  # 0 = unload as soon as idle
        (5.0, 4.0, False),
        (5.0, 5.0, True),
        (math.inf, 1e9, False),  # negative keep-alive: only memory pressure removes it
        (None, 299.0, False),  # default 5 minutes
        (None, 300.0, True),
    ],
)
def test_keep_alive_values(keep_alive: float | None, advance: float, expired: bool) -> None:
    policy, clock = make()
    a = load(policy, "a", 10)
    policy.acquire(a)
    policy.release(a, keep_alive)
    clock.advance(advance)
    assert bool(policy.expired()) is expired


def test_forever_entry_is_still_evictable_for_memory() -> None:
    policy, _ = make(budget=100)
    a = load(policy, "a", 60)
    policy.acquire(a)
    policy.release(a, parse_keep_alive(-1))
    assert policy.get(a) is not None and policy.get(a).expires_at == math.inf  # type: ignore[union-attr]
    plan = policy.plan(key("b"), 60)
    assert plan.action == "evict" and plan.victims == (a,)
    assert policy.next_expiry() is None


def test_keep_alive_is_sticky_and_busy_entries_never_expire() -> None:
    policy, clock = make()
    a = load(policy, "a", 10)
    policy.acquire(a)
    policy.acquire(a)
    policy.release(a, 0.0)
    clock.advance(50)
    assert policy.expired() == [], "one request still in flight"
    policy.release(a)  # no keep_alive given: the last one (0) sticks
    assert [e.key for e in policy.expired()] == [a]
    with pytest.raises(ModeldError, match="without a matching acquire"):
        policy.release(a)


def test_loaded_but_unused_entry_expires_after_default_and_pinned_never() -> None:
    policy, clock = make(default_keep_alive_s=60.0)
    a = load(policy, "a", 10)
    b = load(policy, "b", 10, pinned=True)
    clock.advance(60)
    assert [e.key for e in policy.expired()] == [a]
    policy.set_pinned(b, False)
    policy.touch(b, 10.0)
    clock.advance(10)
    assert {e.key for e in policy.expired()} == {a, b}


def test_queued_entry_does_not_expire() -> None:
    policy, clock = make()
    a = load(policy, "a", 10)
    policy.touch(a, 0.0)
    policy.enqueue(a)
    clock.advance(10)
    assert policy.expired() == []
    policy.dequeue(a)
    assert [e.key for e in policy.expired()] == [a]


# ---- failed loads ---------------------------------------------------------------------------


def test_failed_load_cools_down_with_backoff() -> None:
    policy, clock = make(failure_cooldown_s=30.0)
    a = key("a")
    policy.begin_load(a, 10, 2048, "t", "r1")
    policy.load_failed(a, "bad magic", ErrorCode.INVALID_MODEL.value)
    assert policy.get(a) is None and policy.used_bytes() == 0
    assert policy.recent_failure(a) == "bad magic"
    plan = policy.plan(a, 10)
    assert plan.action == "refuse" and plan.failure == "bad magic"
    err = plan.error()
    assert isinstance(err, InvalidModelError) and "bad magic" in err.message
    with pytest.raises(InvalidModelError):
        policy.begin_load(a, 10, 2048, "t", "r2")
    assert policy.plan(key("a", mtime=1), 10).action == "admit", "a changed file is a new key"
    clock.advance(30)
    assert policy.recent_failure(a) is None and policy.plan(a, 10).action == "admit"
    policy.begin_load(a, 10, 2048, "t", "r3")
    policy.load_failed(a, "crashed", ErrorCode.RUNNER_CRASHED.value)
    clock.advance(59)
    assert policy.recent_failure(a) == "crashed" and policy.failure_retry_in(a) == 1.0
    assert policy.plan(a, 10).error().code is ErrorCode.RUNNER_CRASHED
    policy.load_failed(a, "again")  # third consecutive failure: 30 s doubled twice
    cooling = policy.stats()["cooling_down"]
    assert isinstance(cooling, list) and cooling[0]["reason"] == "again"
    assert cooling[0]["retry_in_s"] == 120.0 and cooling[0]["count"] == 3
    policy.clear_failure(a)
    assert policy.recent_failure(a) is None and policy.stats()["cooling_down"] == []
    policy.load_failed(a, "fresh")  # the count restarts after an explicit retry
    assert policy.failure_retry_in(a) == 30.0
    assert policy.stats()["load_failures"] == 4


def test_failed_load_of_a_live_runner_stays_charged_until_it_exits() -> None:
    """A timed-out load's runner may still be reading the model: its bytes are not free yet."""
    policy, _ = make(budget=100)
    a = key("a")
    policy.begin_load(a, 60, 2048, "t", "r1")
    policy.load_failed(a, "took too long", ErrorCode.TIMEOUT.value, runner_alive=True)
    assert policy.get(a) is None and policy.slots_used() == 0
    assert policy.used_bytes() == 60
    assert policy.plan(key("b"), 60).action == "wait"
    assert policy.unload_finished("r1") is not None
    assert policy.used_bytes() == 0 and policy.plan(key("b"), 60).action == "admit"


# ---- accounting ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("estimate", "measured", "next_need", "action"),
    [
        (40, 40, 60, "admit"),
        (40, 30, 70, "admit"),  # over-estimate: the room is given back
        (40, 60, 60, "evict"),  # under-estimate: the next plan sees the real size
        (40, None, 60, "admit"),  # no measurement: the estimate stays charged
    ],
)
def test_measured_footprint_replaces_estimate(
    estimate: int, measured: int | None, next_need: int, action: str
) -> None:
    policy, _ = make(budget=100)
    a = key("a")
    entry = policy.begin_load(a, estimate, 2048, "t", "r-a")
    assert policy.used_bytes() == estimate and entry.accounted_bytes == estimate
    policy.load_succeeded(a, measured, 4096, 0.7)
    assert entry.accounted_bytes == (estimate if measured is None else measured)
    assert entry.state is EntryState.READY and entry.n_ctx == 4096
    assert policy.plan(key("b"), next_need).action == action


def test_overshoot_is_rebalanced_and_blocks_admission() -> None:
    policy, clock = make(budget=100)
    a = load(policy, "a", 40)
    b = key("b")
    policy.begin_load(b, 60, 2048, "t", "r-b")
    policy.acquire(b)  # joined request waiting for the load
    policy.load_succeeded(b, 80, 2048, 1.0)
    assert policy.over_budget_bytes() == 20
    plan = policy.rebalance()
    assert plan is not None and plan.action == "evict" and plan.victims == (a,)
    # Meanwhile a new model must not be admitted into the overshoot.
    assert policy.plan(key("c"), 1).action == "evict"
    assert policy.plan(key("c"), 30).action == "wait", "the 20 over budget must be paid first"
    apply(policy, plan)
    assert policy.rebalance() is None and policy.used_bytes() == 80
    policy.begin_load(key("c"), 20, 2048, "t", "r-c")
    policy.update_measured(key("c"), 30)  # still loading, measured mid-way
    assert policy.over_budget_bytes() == 10
    plan = policy.rebalance()
    assert plan is not None and plan.action == "wait" and plan.victims == ()
    clock.advance(1)
    assert policy.plan(key("d"), 1).action == "wait"


def test_stats() -> None:
    policy, clock = make(budget=100, max_models=2)
    a = load(policy, "a", 40, measured=50)  # +25 %
    policy.record_miss()
    policy.record_request()
    policy.acquire(a)
    policy.record_tokens(10, prompt=5)
    policy.release(a)
    policy.record_hit()
    policy.record_hit()
    policy.record_request()
    policy.record_request()
    b = key("b")
    policy.begin_load(b, 40, 2048, "t", "r-b")
    policy.load_succeeded(b, 30, 2048, 1.5)  # -25 %
    policy.remove(a, EvictionReason.KEEP_ALIVE)
    policy.remove(b, EvictionReason.EXPLICIT)
    assert policy.remove(b, EvictionReason.EXPLICIT) is None  # already gone: not counted twice
    clock.advance(12.5)
    s = policy.stats()
    json.dumps(s, allow_nan=False)
    assert s["hits"] == 2 and s["misses"] == 1 and s["hit_rate"] == pytest.approx(2 / 3)
    assert s["loads"] == 2 and s["load_seconds_total"] == pytest.approx(2.0)
    assert s["load_seconds_mean"] == pytest.approx(1.0)
    assert s["evictions"]["keep_alive"] == 1 and s["evictions"]["explicit"] == 1  # type: ignore[index]
    assert s["evictions_total"] == 2
    assert s["estimate_error_samples"] == pytest.approx([0.25, -0.25])
    assert s["estimate_error_mean"] == pytest.approx(0.0)
    assert s["estimate_abs_error_mean"] == pytest.approx(0.25)
    assert s["tokens_generated"] == 10 and s["prompt_tokens"] == 5 and s["requests"] == 3
    assert s["uptime_s"] == pytest.approx(12.5)
    assert s["used_bytes"] == 0


def test_entry_to_dict_is_json_safe() -> None:
    policy, clock = make()
    a = load(policy, "a", 10)
    policy.acquire(a)
    policy.release(a, math.inf)
    b = load(policy, "b", 10)
    clock.advance(100)
    for e in policy.entries():
        json.dumps(e.to_dict(clock.t), allow_nan=False)
    ea, eb = (policy.get(a), policy.get(b))
    assert isinstance(ea, Entry) and isinstance(eb, Entry)
    assert ea.to_dict(clock.t)["forever"] is True and ea.to_dict(clock.t)["expires_in_s"] is None
    assert eb.to_dict(clock.t)["expires_in_s"] == pytest.approx(200.0)


# ---- the invariant under random operation sequences ----------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_budget_invariant_random_sequence(seed: int) -> None:
    rng = random.Random(seed)
    budget = 1000
    policy, clock = make(budget=budget, max_models=3, failure_cooldown_s=5.0)
    names = [f"m{i}" for i in range(8)]
    sizes = {n: rng.randint(50, 700) for n in names}
    counts = {"admit": 0, "evict": 0, "wait": 0, "refuse": 0, "overshoot": 0}
    unloading: list[str] = []

    for _step in range(10_000):
        clock.advance(rng.random() * 3)
        op = rng.random()
        name = rng.choice(names)
        k = key(name)
        entry = policy.get(k)
        if op < 0.35:  # a request for a model
            if entry is not None and entry.state is EntryState.READY and rng.random() < 0.8:
                policy.acquire(k)
                continue
            need = sizes[name] * rng.choice([1, 1, 2]) // 2 + rng.randint(0, 50)
            plan = policy.plan(k, need)
            counts[plan.action] += 1
            if plan.action in ("wait", "refuse"):
                assert plan.victims == ()
                continue
            for victim in plan.victims:
                assert policy.get(victim) is not None and (
                    victim == k or policy.get(victim).evictable  # type: ignore[union-attr]
                )
            apply(policy, plan)
            assert policy.plan(k, need).action == "admit"
            policy.begin_load(k, need, 2048, "t", f"r{_step}", pinned=rng.random() < 0.05)
            assert policy.used_bytes() <= budget, "admission broke the budget"
            assert policy.slots_used() <= policy.max_models
        elif op < 0.5:  # a load finishes
            loading = [e for e in policy.entries() if e.state is EntryState.LOADING]
            if loading:
                e = rng.choice(loading)
                if rng.random() < 0.1:
                    policy.load_failed(e.key, "boom")
                else:
                    measured = int(e.estimate_bytes * rng.uniform(0.6, 1.3))
                    policy.load_succeeded(e.key, measured, e.n_ctx, rng.random())
                    counts["overshoot"] += measured > e.estimate_bytes
        elif op < 0.75:  # a request ends
            busy = [e for e in policy.entries() if e.in_flight > 0]
            if busy:
                e = rng.choice(busy)
                policy.release(e.key, rng.choice([None, 0.0, 5.0, 60.0, math.inf]))
        elif op < 0.85:  # keep-alive timer
            for e in policy.expired():
                assert e.evictable
                policy.remove(e.key, EvictionReason.KEEP_ALIVE)
        elif op < 0.9 and entry is not None and entry.state is EntryState.READY:
            policy.set_pinned(k, not entry.pinned)
        elif op < 0.95 and entry is not None and not entry.busy:  # explicit unload
            unloading.append(policy.begin_unload(k, EvictionReason.EXPLICIT).runner_id)
        elif unloading:
            policy.unload_finished(unloading.pop(rng.randrange(len(unloading))))
        # The daemon rebalances after every event; then only busy/pinned memory may overshoot.
        fix = policy.rebalance()
        if fix is not None and fix.action == "evict":
            apply(policy, fix)
        assert policy.slots_used() <= policy.max_models
        if policy.used_bytes() > budget:
            assert policy.lru_order() == [], "idle entries left while over budget"
        assert sum(e.accounted_bytes for e in policy.entries()) == policy.used_bytes()

    assert all(counts[a] > 20 for a in ("admit", "evict", "wait", "refuse")), counts
    assert counts["overshoot"] > 10


def test_old_failures_are_forgotten() -> None:
    policy, clock = make(failure_cooldown_s=30.0)
    policy.load_failed(key("a"), "x")
    clock.advance(30 + 601)
    policy.load_failed(key("b"), "y")  # prunes a's stale record
    policy.load_failed(key("a"), "x")
    assert policy.failure_retry_in(key("a")) == 30.0, "the back-off restarted"
    policy.load_failed(key("b"), "y")
    assert policy.failure_retry_in(key("b")) == 60.0

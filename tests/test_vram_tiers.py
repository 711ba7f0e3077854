"""The cache over two tiers, RAM and each card's VRAM (pure, fake cards: issue 34).

The budget is per device; a victim is taken only when it frees the tier that is short (an idle
model holding VRAM goes, a CPU-only one stays, a busy or pinned one is never taken); loads that
have not allocated yet count; a model that does not fit the card beside busy ones gets fewer
layers (the rest in RAM) instead of waiting; an automatic context shrinks to keep every layer
on the card. Models are TinyLlama-1.1B-shaped f16 headers (test_placement.llama)."""

from __future__ import annotations

import math

import pytest

from modeld import sizing
from modeld.cache.policy import CachePolicy, EvictionReason, ModelKey
from modeld.config import Settings
from modeld.model import placement
from modeld.model.placement import Card, Gpu, Where
from test_placement import llama

MiB, GiB = 1 << 20, 1 << 30
INFO = llama()  # 22 blocks + output: 23 layers, 2.2 GB
LAYERS = INFO.block_count + 1
SETTINGS = Settings(parallel=1, prompt_cache_mib=0)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def cache_with(cards: tuple[int, ...] = (16 * GiB,), ram: int = 64 * GiB) -> CachePolicy:
    cache = CachePolicy(ram, 4, Clock())
    cache.set_vram_budgets(cards)
    return cache


def key(name: str) -> ModelKey:
    return ModelKey(f"/m/{name}.gguf", 1, 1)


def resident(cache: CachePolicy, name: str, ram: int, vram: tuple[int, ...] = (), *,
             busy: bool = False, pinned: bool = False,
             keep_alive_s: float | None = None) -> ModelKey:  # fmt: skip
    """A loaded model (idle unless ``busy``); each one is used after the one before."""
    k = key(name)
    cache.begin_load(k, ram, 4096, "test", f"r-{name}", pinned=pinned, vram=vram,
                     keep_alive_s=keep_alive_s, gpu_layers=LAYERS if vram else 0)  # fmt: skip
    cache.load_succeeded(k, None, 4096, 0.1)
    if busy:
        cache.acquire(k)
    cache._clock.now += 1  # type: ignore[attr-defined]
    return k


def where(cache: CachePolicy, k: ModelKey, layers: int | None = None) -> Where:
    """What the daemon plans a load of ``k`` with: each card's room from the cache."""
    rooms = cache.vram_available_for(k)
    gpus = tuple(Gpu(i, f"CUDA{i}", 80 * GiB, r) for i, r in enumerate(rooms))
    return Where("f16", gpus, layers, margin=0)


def size(cache: CachePolicy, k: ModelKey, requested: int | None = None) -> sizing.Sizing:
    return sizing.size_for(INFO, "generate", cache, k, 50 * MiB, requested, SETTINGS,
                           where=where(cache, k))  # fmt: skip


# ----------------------------------------------------------------------- the budget per card


def test_a_card_budget_leaves_out_what_other_processes_hold() -> None:
    mine, other = 4242, 999
    card = Card(0, "H100", 80 * GiB, 70 * GiB, {mine: 10 * GiB, other: 60 * GiB})
    # another process holds 60 GiB: modeld's models may hold the rest (its own 10 included)
    assert placement.vram_budget(card, {mine}, 0, margin=0) == 20 * GiB
    assert placement.vram_budget(card, {mine}, 0) == 20 * GiB - placement.VRAM_MARGIN
    # NVML named no process: what modeld accounts there is taken as its own
    blind = Card(0, "H100", 80 * GiB, 70 * GiB, None)
    assert placement.vram_budget(blind, {mine}, 10 * GiB, margin=0) == 20 * GiB
    full = Card(0, "tiny", 2 * GiB, 2 * GiB, {other: 2 * GiB})
    assert placement.vram_budget(full, {mine}, 0) == 0  # never negative


def test_no_card_plans_exactly_as_before() -> None:
    cache = cache_with(cards=())
    a = resident(cache, "a", 4 * GiB)
    assert cache.vram_used() == () and cache.vram_available_for(a) == ()
    plan = cache.plan(key("b"), 70 * GiB)
    assert plan.action == "refuse" and "budget" in plan.reason and not plan.need_vram


# ----------------------------------------------------------------------- eviction per tier


def test_an_idle_model_holding_vram_goes_and_a_cpu_only_one_stays() -> None:
    cache = cache_with()
    cpu = resident(cache, "cpu", 2 * GiB)  # used first: the LRU victim for RAM
    gpu = resident(cache, "gpu", 1 * GiB, (12 * GiB,))
    new = key("new")
    assert cache.vram_available_for(new) == (16 * GiB,)  # 4 free + 12 of an idle model
    plan = cache.plan(new, 1 * GiB, (8 * GiB,))
    assert plan.action == "evict" and plan.victims == (gpu,), plan
    assert plan.victim_reason(gpu) is EvictionReason.VRAM and "VRAM" in plan.reason
    assert cpu not in plan.victims  # it frees no VRAM
    # short of RAM instead: the LRU one goes, whatever it holds
    ram_plan = cache.plan(new, 62 * GiB)
    assert ram_plan.victims[0] == cpu and ram_plan.victim_reason(cpu) is EvictionReason.MEMORY


def test_a_busy_or_pinned_vram_holder_is_never_taken_a_forever_one_is() -> None:
    cache = cache_with()
    busy = resident(cache, "busy", 1 * GiB, (6 * GiB,), busy=True)
    resident(cache, "pinned", 1 * GiB, (4 * GiB,), pinned=True)
    forever = resident(cache, "forever", 1 * GiB, (5 * GiB,), keep_alive_s=math.inf)
    new = key("new")
    assert cache.vram_available_for(new) == (6 * GiB,)  # 1 free + the forever one's 5
    plan = cache.plan(new, 1 * GiB, (6 * GiB,))
    assert plan.action == "evict" and plan.victims == (forever,)
    wait = cache.plan(new, 1 * GiB, (8 * GiB,))  # only the busy model could make room
    assert wait.action == "wait" and "GPU 0" in wait.reason and busy not in wait.victims
    refuse = cache.plan(new, 1 * GiB, (13 * GiB,))  # past the card less what is pinned
    assert refuse.action == "refuse" and "pinned" in refuse.reason
    assert refuse.error().details["need_vram"] == [13 * GiB]


def test_two_cards_evict_only_from_the_card_that_is_short() -> None:
    cache = cache_with(cards=(16 * GiB, 16 * GiB))
    on0 = resident(cache, "on0", 1 * GiB, (12 * GiB, 0))  # least recently used
    on1 = resident(cache, "on1", 1 * GiB, (0, 12 * GiB))
    plan = cache.plan(key("new"), 1 * GiB, (0, 8 * GiB))
    assert plan.victims == (on1,) and on0 not in plan.victims
    assert cache.vram_available_for(key("new")) == (16 * GiB, 16 * GiB)


def test_a_load_in_progress_counts_before_it_allocates() -> None:
    cache = cache_with()
    first = key("first")
    cache.begin_load(first, 1 * GiB, 4096, "test", "r1", vram=(10 * GiB,))  # still loading
    second = key("second")
    assert cache.vram_used() == (10 * GiB,)
    assert cache.vram_available_for(second) == (6 * GiB,)
    assert cache.plan(second, 1 * GiB, (6 * GiB,)).action == "admit"
    assert cache.plan(second, 1 * GiB, (7 * GiB,)).action == "wait"  # never both on 16 GiB


def test_measured_vram_over_a_cards_budget_evicts_an_idle_holder_there() -> None:
    cache = cache_with()
    resident(cache, "cpu", 2 * GiB)
    idle = resident(cache, "idle", 1 * GiB, (6 * GiB,))
    busy = resident(cache, "busy", 1 * GiB, (8 * GiB,), busy=True)
    assert cache.rebalance() is None
    cache.update_vram(busy, (11 * GiB,))  # its compute buffers grew past the plan
    plan = cache.rebalance()
    assert plan is not None and plan.action == "evict" and plan.victims == (idle,)
    assert plan.victim_reason(idle) is EvictionReason.VRAM and "GPU 0" in plan.reason


def test_vram_estimate_accuracy_is_kept_as_for_ram() -> None:
    cache = cache_with()
    k = key("m")
    cache.begin_load(k, 1 * GiB, 4096, "test", "r1", vram=(4 * GiB,), gpu_layers=LAYERS)
    cache.load_succeeded(k, 1 * GiB, 4096, 0.1, measured_vram=(5 * GiB,))
    stats = cache.stats()
    assert stats["vram_estimate_error_mean"] == pytest.approx(0.25)
    assert stats["vram_estimate_error_samples"] == [pytest.approx(0.25)]
    assert stats["estimate_error_mean"] == pytest.approx(0.0)
    assert stats["vram_used_bytes"] == [5 * GiB] and stats["vram_budget_bytes"] == [16 * GiB]
    assert cache.get(k).to_dict()["vram_bytes"] == [5 * GiB]  # type: ignore[union-attr]


# ----------------------------------------------------------------------- sizing with the tiers


def test_a_second_model_that_does_not_fit_the_card_goes_partly_to_ram() -> None:
    cache = cache_with(cards=(5 * GiB,))
    a = key("a")
    first = size(cache, a)
    assert first.placement.gpu_layers == LAYERS  # alone, all of it fits 5 GiB
    cache.begin_load(a, first.need_bytes, first.n_ctx, first.reason, "r1",
                     vram=first.placement.vram, gpu_layers=LAYERS)  # fmt: skip
    cache.load_succeeded(a, None, first.n_ctx, 0.1)
    cache.acquire(a)  # busy: its VRAM is not room
    b = key("b")
    second = size(cache, b)
    assert 0 < second.placement.gpu_layers < LAYERS, second.placement
    assert second.placement.vram[0] <= 5 * GiB - first.placement.vram[0]
    assert second.need_bytes > first.need_bytes  # what left the card is charged to RAM
    plan = cache.plan(b, second.need_bytes, second.placement.vram)
    assert plan.action == "admit", plan.reason  # fewer layers now, rather than a wait
    # the same model idle instead: it is evicted from the card and b gets every layer
    cache.release(a)
    again = size(cache, b)
    assert again.placement.gpu_layers == LAYERS
    evict = cache.plan(b, again.need_bytes, again.placement.vram)
    assert evict.action == "evict" and evict.victims == (a,)
    assert evict.victim_reason(a) is EvictionReason.VRAM


def test_a_reload_with_a_larger_context_gets_fewer_layers_rather_than_a_refusal() -> None:
    big = Where(gpus=(Gpu(0, "c", 0, 80 * GiB),), gpu_layers=None, margin=0)
    first_size = sizing.estimate_n(INFO, 4096, where=big)
    cache = cache_with(cards=(first_size.vram + 64 * MiB,))  # the card holds it at 4096
    a = key("a")
    got = size(cache, a, requested=4096)
    assert got.placement.gpu_layers == LAYERS
    cache.begin_load(a, got.need_bytes, 4096, got.reason, "r1", vram=got.placement.vram,
                     gpu_layers=LAYERS)  # fmt: skip
    cache.load_succeeded(a, None, 4096, 0.1)
    grown = size(cache, a, requested=32768)  # a long prompt: its own VRAM is room
    assert grown.n_ctx == 32768 and 0 < grown.placement.gpu_layers < LAYERS
    plan = cache.plan(a, grown.need_bytes, grown.placement.vram)
    assert plan.action == "evict" and plan.victim_reason(a) is EvictionReason.RELOAD


def test_an_automatic_context_shrinks_to_keep_every_layer_on_the_card() -> None:
    at = {n: sizing.estimate_n(INFO, n, where=Where(gpus=(Gpu(0, "c", 0, 80 * GiB),),
                                                     gpu_layers=None, margin=0)).vram
          for n in (4096, 6144, 8192)}  # fmt: skip
    assert at[4096] < at[6144] < at[8192]
    cache = cache_with(cards=(at[6144] + 1 * MiB,))  # every layer fits up to 6144, not 8192
    got = size(cache, key("a"))  # the RAM budget alone would give the ceiling, 8192
    assert got.n_ctx == 6144 and got.placement.gpu_layers == LAYERS, got.reason
    assert f"keeps {LAYERS} of {LAYERS} layers" in got.reason
    asked = size(cache, key("a"), requested=8192)  # a context asked for is never shrunk
    assert asked.n_ctx == 8192 and asked.placement.gpu_layers < LAYERS
    # a card that cannot take every layer even at the floor: the context that keeps the most
    small = cache_with(cards=(at[4096] // 2,))
    half = size(small, key("a"))
    at_floor = placement.place(INFO, 4096, where(small, key("a")).gpus, None, margin=0)
    assert half.placement.gpu_layers == at_floor.gpu_layers


def test_which_layers_go_where() -> None:
    p = placement.Placement(13, LAYERS, (1, 1), (0.6, 0.4))
    assert placement.layer_map(p, ["CUDA0", "CUDA1"]) == {
        "RAM": "0-9", "CUDA0": "10-17", "CUDA1": "18-22"}
    assert placement.layer_map(placement.Placement(LAYERS, LAYERS, (1,)), ["CUDA0"]) == {
        "CUDA0": f"0-{LAYERS - 1}"}
    assert placement.layer_map(placement.Placement(0, LAYERS), []) == {"RAM": f"0-{LAYERS - 1}"}

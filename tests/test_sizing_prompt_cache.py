"""The daemon's sizing counts each generate-mode runner's prompt cache (pure, no daemon)."""

from __future__ import annotations

import time

from modeld import sizing
from modeld.cache.policy import CachePolicy, ModelKey
from modeld.config import Settings
from test_memory import make_info

MiB = 1 << 20


def test_breakdown_and_reservation_include_the_configured_prompt_cache() -> None:
    info = make_info()
    on, off = Settings(prompt_cache_mib=48), Settings(prompt_cache_mib=0)
    assert sizing.breakdown(info, 2048, "generate", on)["prompt_cache"] == 48 * MiB
    assert sizing.breakdown(info, 2048, "generate", off)["prompt_cache"] == 0
    assert sizing.breakdown(info, 2048, "embed", on)["prompt_cache"] == 0
    assert sizing.breakdown(info, 2048, "generate")["prompt_cache"] == 32 * MiB  # no settings
    cache = CachePolicy(8 << 30, 3, time.monotonic)
    key = ModelKey("/models/x.gguf", 1, 1, "generate")
    a = sizing.size_for(info, "generate", cache, key, 48 * MiB, 2048, on)
    b = sizing.size_for(info, "generate", cache, key, 48 * MiB, 2048, off)
    assert a.n_ctx == b.n_ctx == 2048
    assert a.estimate_bytes == b.estimate_bytes  # the calibrated model estimate
    assert a.need_bytes - b.need_bytes == 48 * MiB  # what the daemon reserves
    # a budget that fits the model only without its cache gets a smaller context
    est_2048 = b.estimate_bytes
    tight = CachePolicy(est_2048 + 48 * MiB + 10 * MiB, 3, time.monotonic)
    assert sizing.max_context(info, "generate", tight, key, 48 * MiB, off) >= 2048
    assert sizing.max_context(info, "generate", tight, key, 48 * MiB, on) < 2048


def test_the_automatic_prompt_cache_grows_with_the_memory_budget() -> None:
    """By default the cache is a share of the budget (an agent's long prefixes and their
    checkpoints stay resident while memory allows), reserved with the load and sent to the
    runner."""
    info = make_info()
    auto = Settings()
    key = ModelKey("/models/x.gguf", 1, 1, "generate")
    small = sizing.size_for(info, "generate", CachePolicy(1 << 30, 3, time.monotonic), key,
                            48 * MiB, 2048, auto)
    large = sizing.size_for(info, "generate", CachePolicy(16 << 30, 3, time.monotonic), key,
                            48 * MiB, 2048, auto)
    assert small.prompt_cache_bytes == 64 * MiB and large.prompt_cache_bytes == 1024 * MiB
    assert large.need_bytes - small.need_bytes == 960 * MiB
    assert large.estimate_bytes == small.estimate_bytes

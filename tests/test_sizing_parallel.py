"""How many sequences a load gets and what they cost (pure: real policy code, no daemon)."""

from __future__ import annotations

import time

import pytest

from modeld import sizing
from modeld.cache.policy import CachePolicy, ModelKey
from modeld.config import Settings
from modeld.errors import InsufficientMemoryError
from modeld.model import memory
from test_memory import make_info

MiB = 1 << 20
KEY = ModelKey("/models/x.gguf", 1, 1, "generate")
BASE = 48 * MiB


def cache(budget: int) -> CachePolicy:
    return CachePolicy(budget, 3, time.monotonic)


def test_n_sequences_cost_the_kv_of_all_of_them() -> None:
    info = make_info()
    one = sizing.estimate_n(info, 2048, parallel=1)
    four = sizing.estimate_n(info, 2048, parallel=4)
    assert one.total == memory.estimate(info, 2048).total  # parallel 1 is the old estimate
    assert four.kv_cache >= 4 * one.kv_cache * 0.99
    assert four.weights_file == one.weights_file  # the weights are shared


def test_automatic_is_four_when_memory_allows() -> None:
    """llama-server's automatic slot count, lowered when four contexts do not fit."""
    info = make_info()
    roomy = sizing.size_for(info, "generate", cache(8 << 30), KEY, BASE, None,
                            Settings(prompt_cache_mib=0))
    assert roomy.parallel == sizing.AUTO_PARALLEL == 4
    assert roomy.parallel_reason == sizing.AUTO_REASON
    two = sizing.estimate_n(info, 2048, parallel=2).total
    tight = sizing.size_for(info, "generate", cache(two + BASE + MiB), KEY, BASE, None,
                            Settings(prompt_cache_mib=0))
    assert (tight.parallel, tight.n_ctx) == (2, 2048)


def test_asked_for_four_gets_what_fits() -> None:
    info = make_info()
    s = Settings(prompt_cache_mib=0, parallel=4)
    roomy = sizing.size_for(info, "generate", cache(8 << 30), KEY, BASE, None, s)
    assert roomy.parallel == 4 and roomy.parallel_reason == "the parallel setting"
    # room for two contexts of the floor (2048), not four: two, and the reason says why
    two = sizing.estimate_n(info, 2048, parallel=2).total
    tight = cache(two + BASE + MiB)
    got = sizing.size_for(info, "generate", tight, KEY, BASE, None, s)
    assert (got.parallel, got.n_ctx) == (2, 2048)
    assert "asked for 4; 2 contexts of 2048 tokens are what fit" in got.parallel_reason
    assert got.need_bytes <= tight.budget_bytes


def test_explicit_values_and_embedding() -> None:
    info = make_info()
    s = Settings(prompt_cache_mib=0, parallel=2)
    got = sizing.size_for(info, "generate", cache(8 << 30), KEY, BASE, None, s)
    assert (got.parallel, got.parallel_reason) == (2, "the parallel setting")
    got = sizing.size_for(info, "generate", cache(8 << 30), KEY, BASE, None, s, parallel=6)
    assert (got.parallel, got.parallel_reason) == (6, "requested by the load")
    embed = sizing.size_for(info, "embed", cache(8 << 30), KEY, BASE, None, s, parallel=6)
    assert embed.parallel == 1 and embed.parallel_reason.startswith("embedding")


def test_a_model_that_never_fits_one_sequence_is_refused() -> None:
    info = make_info()
    with pytest.raises(InsufficientMemoryError):
        sizing.size_for(info, "generate", cache(BASE + MiB), KEY, BASE, None, Settings())

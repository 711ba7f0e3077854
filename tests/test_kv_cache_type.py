"""The KV cache type (issue 34): q8_0 and q4_0 reach llama.cpp, shrink the estimate by what
they save, reload a model asked with another type, and keep greedy replies batch-invariant.
Real runners, a real daemon, real llama-cpp-python (CPU)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from daemonutil import rows
from modeld import sizing
from modeld.model import kvcache
from modeld.model.gguf import read_model_info
from test_batch_invariance import _solo, _together, runner  # noqa: F401  (fixture)
from test_runner import Harness

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_greedy_replies_stay_batch_invariant_with_a_quantized_cache(
    runner: Harness, model_factory: Any, kv: str  # noqa: F811
) -> None:
    """As test_batch_invariance's other architecture, with a quantized K and V cache (flash
    attention's quantized-KV path: the runner always loads with flash attention)."""
    # heads of 32: a quantized cache needs whole blocks of 32 per head
    model = model_factory("llama", **dict(ggufgen.Q8, n_embd=128, n_ff=256, context_length=4096))
    runner.loaded(model, n_ctx=1024, parallel=8, n_threads=2, prompt_cache_mib=0,
                  type_k=kv, type_v=kv)  # fmt: skip
    words = ("the quick brown fox", "once upon a time", "1 2 3 4", "hello world")
    prompts = [" ".join([words[i % 4]] * (4 + 30 * (i % 3))) + f" {i}" for i in range(8)]
    solo = _solo(runner, prompts, 40)
    for n in (4, 8):
        assert _together(runner, prompts[:n], [40] * n, f"n{n}") == solo[:n], n


def test_daemon_loads_with_the_type_asked_and_counts_it(
    daemon_factory: Callable[..., Any], model_factory: Any
) -> None:
    model = model_factory("llama", **dict(ggufgen.TINY, n_layer=8, n_embd=128, n_head=2,
                                          n_ff=256, context_length=8192))  # fmt: skip
    d = daemon_factory(env={"OLLAMA_KV_CACHE_TYPE": "q4_0"})  # Ollama's variable is read
    c = d.client()
    row = c.load(str(model), n_ctx=8192, parallel=1)
    assert row["kv_cache_type"] == "q4_0"
    assert (row["processor"], row["gpu_layers"], row["size_vram"]) == ("100% CPU", 0, 0)
    info = read_model_info(str(model))
    f16 = sizing.estimate_n(info, 8192).total
    q4 = sizing.estimate_n(info, 8192, kv_type="q4_0").total
    kv16 = kvcache.kv_cache_bytes(info, 8192)
    assert f16 - q4 == pytest.approx(kv16 * (1 - 18 / 64), rel=0.01)
    q8 = sizing.estimate_n(info, 8192, kv_type="q8_0").total

    def kv_lines() -> list[str]:
        return [line for p in sorted(d.log_dir.glob("runner-*.load.log"))
                for line in p.read_text().splitlines() if "K (" in line]  # fmt: skip

    assert any("K (q4_0)" in line and "V (q4_0)" in line for line in kv_lines()), kv_lines()
    pid = rows(c)[model.name]["runner_pid"]
    # another type asked for explicitly: a reload with it (never a silent keep)
    again = c.load(str(model), n_ctx=8192, parallel=1, kv_cache_type="q8_0")
    assert again["kv_cache_type"] == "q8_0" and again["runner_pid"] != pid
    # the reservation moved by what the estimate says q8_0 costs over q4_0 (8 MiB here; the
    # runner baseline in it is re-measured by each runner: a little noise)
    grew = int(again["estimate_bytes"] or 0) - int(row["estimate_bytes"] or 0)
    assert grew == pytest.approx(q8 - q4, abs=3 << 20) and q8 - q4 > 6 << 20
    assert any("K (q8_0)" in line for line in kv_lines())
    assert c.generate(str(model), "hello", max_tokens=4).text() is not None


def test_bad_kv_type_is_refused_naming_the_field(daemon_factory: Callable[..., Any],
                                                 tiny_model: Path) -> None:  # fmt: skip
    from modeld.errors import ModeldError

    c = daemon_factory().client()
    with pytest.raises(ModeldError, match="kv_cache_type"):
        c.load(str(tiny_model), kv_cache_type="q3_k")
    # heads of 16 cannot hold q8_0 blocks: refused before any load, saying what to do
    with pytest.raises(ModeldError, match="multiples of 32") as info:
        c.load(str(tiny_model), kv_cache_type="q8_0")
    assert "f16" in info.value.hint

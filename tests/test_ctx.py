"""Table-driven tests of the dynamic context policy (modeld.model.ctx).

Most cases use a linear stand-in estimate (1000 bytes + 1 byte per token) so expected answers
can be written down exactly; the last ones run the real estimator on the real default model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modeld.errors import InsufficientMemoryError
from modeld.model import ctx, memory
from modeld.model.gguf import read_model_info
from modeld.model.memory import MemoryEstimate
from modeld.model.modelinfo import ModelInfo

BASE = 1000


def info(context_length: int = 32768) -> ModelInfo:
    return ModelInfo(
        path="/m/x.gguf", file_size=1, gguf_version=3, architecture="llama", name="x",
        size_label=None, file_type=None, quantization=None, context_length=context_length,
        block_count=1, embedding_length=64, head_count=1, head_count_kv=(1,), key_length=64,
        value_length=64, sliding_window=None, sliding_layers=(False,), vocab_size=300,
        has_chat_template=False, pooling_type=None, tensor_bytes=1, tensor_count=1, data_offset=0,
    )  # fmt: skip


class LinearEstimate:
    """BASE + n_ctx bytes, recording every call (to check the search and kwargs)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[str, Any]]] = []

    def __call__(self, model: ModelInfo, n_ctx: int, **kwargs: Any) -> MemoryEstimate:
        self.calls.append((n_ctx, kwargs))
        return MemoryEstimate(
            n_ctx=n_ctx, weights=BASE, weights_file=BASE, weights_anon=0, kv_cache=n_ctx,
            compute=0, output=0, overhead=0, runner_baseline=0,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("training", "budget", "floor", "ceiling", "expected", "reason"),
    [
        (32768, 10**9, 2048, 8192, 8192, "ceiling 8192 (config)"),
        (2048, 10**9, 2048, 8192, 2048, "training context 2048"),
        (8192, 10**9, 2048, 8192, 8192, "training context 8192"),
        (1000, 10**9, 2048, 8192, 768, "training context 1000"),  # rounded down to 256s
        (0, 10**9, 2048, 4096, 4096, "ceiling 4096 (config)"),  # unknown training context
        (32768, BASE + 5000, 2048, 8192, 4864, "memory: 4864 fits in"),
        (32768, BASE + 2048, 2048, 8192, 2048, "memory: 2048 fits in"),
        (32768, BASE + 8191, 2048, 8192, 7936, "memory: 7936 fits in"),
        (32768, BASE + 700, 512, 8192, 512, "memory: 512 fits in"),
        (1024, BASE + 1024, 2048, 8192, 1024, "training context 1024"),  # floor above training
    ],
)
def test_choice_table(
    training: int, budget: int, floor: int, ceiling: int, expected: int, reason: str
) -> None:
    fake = LinearEstimate()
    choice = ctx.choose_context(
        info(training), budget, floor=floor, ceiling=ceiling, estimate_fn=fake
    )
    assert choice.n_ctx == expected
    assert choice.n_ctx % 256 == 0
    assert choice.reason.startswith(reason)
    assert choice.estimate_bytes == BASE + expected <= budget


@pytest.mark.parametrize(
    ("budget", "largest"),
    [(BASE + 2047, 1792), (BASE + 300, 256), (BASE + 100, None), (0, None)],
)
def test_floor_does_not_fit(budget: int, largest: int | None) -> None:
    with pytest.raises(InsufficientMemoryError) as exc:
        ctx.choose_context(info(), budget, estimate_fn=LinearEstimate())
    err = exc.value
    assert "minimum context 2048" in err.message
    assert err.details["needed"] == BASE + 2048
    assert err.details["available"] == budget
    assert err.details["largest_fitting"] == largest
    assert err.to_dict()["code"] == "insufficient_memory"


@pytest.mark.parametrize(
    ("requested", "budget", "expected", "reason"),
    [
        (3000, 10**9, 3072, "requested"),  # rounded up to 256
        (256, 10**9, 256, "requested"),  # below the floor is allowed when asked for
        (16384, 10**9, 16384, "requested"),  # above the ceiling is allowed when asked for
        (65536, 10**9, 32768, "requested 65536, capped at the training context 32768"),
        (300000, 10**9, 32768, "requested 300000, capped at the training context 32768"),
    ],
)
def test_requested_fits(requested: int, budget: int, expected: int, reason: str) -> None:
    choice = ctx.choose_context(info(), budget, requested=requested, estimate_fn=LinearEstimate())
    assert (choice.n_ctx, choice.reason) == (expected, reason)


def test_requested_too_big_reports_numbers() -> None:
    with pytest.raises(InsufficientMemoryError) as exc:
        ctx.choose_context(info(), BASE + 3000, requested=4000, estimate_fn=LinearEstimate())
    err = exc.value
    assert err.details == {
        "n_ctx": 4096, "needed": BASE + 4096, "available": BASE + 3000, "largest_fitting": 2816,
    }  # fmt: skip
    assert "4096" in err.message and "2816" in err.message and "2816" in err.hint


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        ctx.choose_context(info(), 10**9, requested=0, estimate_fn=LinearEstimate())
    with pytest.raises(ValueError):
        ctx.choose_context(info(), 10**9, floor=0, estimate_fn=LinearEstimate())


def test_binary_search_needs_few_estimates() -> None:
    fake = LinearEstimate()
    ctx.choose_context(info(10**6), BASE + 123_456, floor=256, ceiling=10**6, estimate_fn=fake)
    distinct = {n for n, _ in fake.calls}
    assert len(distinct) <= 14  # ~3900 candidates -> log2 + a couple
    assert max(n for n in distinct if n <= 123_456) == 123_392


def test_estimate_kwargs_are_passed_through() -> None:
    fake = LinearEstimate()
    ctx.choose_context(info(), 10**9, estimate_fn=fake, embedding=True, type_k="q8_0")
    assert fake.calls and all(kw == {"embedding": True, "type_k": "q8_0"} for _, kw in fake.calls)


@pytest.mark.parametrize(("n", "up", "down"), [(1, 256, 256), (256, 256, 256), (257, 512, 256)])
def test_rounding(n: int, up: int, down: int) -> None:
    assert (ctx.round_up(n), ctx.round_down(n)) == (up, down)


# --- with the real estimator --------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma(default_model: Path) -> ModelInfo:
    return read_model_info(default_model)


def test_real_model_gets_the_ceiling_with_room(gemma: ModelInfo) -> None:
    choice = ctx.choose_context(gemma, 4 << 30)
    assert (choice.n_ctx, choice.reason) == (8192, "ceiling 8192 (config)")
    assert choice.estimate == memory.estimate(gemma, 8192)


def test_real_model_shrinks_to_fit(gemma: ModelInfo) -> None:
    budget = memory.estimate(gemma, 5120).total - 1  # one byte short of 5120
    choice = ctx.choose_context(gemma, budget)
    assert choice.n_ctx == 4864
    assert choice.estimate_bytes <= budget
    assert choice.reason.startswith("memory: 4864 fits in")


def test_real_model_embed_mode_is_passed_on(gemma: ModelInfo) -> None:
    # embedding with gemma costs more (256 rows of 262k-wide logits reserved, sliding layers
    # over the whole context), so the same budget gives a smaller context than generate mode
    budget = memory.estimate(gemma, 4096, embedding=True).total
    choice = ctx.choose_context(gemma, budget, embedding=True)
    assert choice.n_ctx == 4096
    assert choice.reason.startswith("memory: 4096 fits in")
    assert choice.estimate == memory.estimate(gemma, 4096, embedding=True)
    assert ctx.choose_context(gemma, budget).n_ctx > 4096
    assert choice.to_dict()["n_ctx"] == choice.n_ctx

"""The card path (issue 34), on a machine with an NVIDIA card and a CUDA build of
llama-cpp-python: ``scripts/gpu-check.sh`` runs these (``pytest -m gpu``); elsewhere they are
skipped with the reason. A real daemon, real runners, real CUDA."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from modeld.daemon.forkserver import gpu_backends
from modeld.model import probe

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _why_not() -> str | None:
    if "cuda" not in gpu_backends():
        return "llama-cpp-python has no CUDA backend here (scripts/setup.sh builds one on a card)"
    if not probe.gpu_memory():
        return "no NVIDIA card visible to NVML"
    return None


if _why_not():
    pytestmark.append(pytest.mark.skip(reason=str(_why_not())))

#: 24 blocks of a llama 1024 wide, f16: ~400 MB, a few seconds to load on a card
SHAPE = dict(n_layer=24, n_embd=1024, n_head=16, n_head_kv=4, n_ff=2816, n_vocab=32000,
             context_length=32768, dtype="f16")  # fmt: skip


@pytest.fixture(scope="module")
def model(model_factory: Callable[..., Path]) -> Path:
    return model_factory("llama", **SHAPE)


def test_full_offload_loads_and_is_measured(
    daemon_factory: Callable[..., Any], model: Path
) -> None:
    c = daemon_factory().client(timeout=300)
    row = c.load(str(model), n_ctx=4096, parallel=1)
    assert row["processor"] == "100% GPU" and row["gpu_layers"] == SHAPE["n_layer"] + 1, row
    vram, planned = int(row["size_vram"]), int(row["vram_estimate"])
    assert vram > 0  # NVML's figure for its runner
    print(f"full offload: NVML {vram >> 20} MiB, estimate {planned >> 20} MiB")
    assert 0.8 < planned / vram < 1.25, (planned, vram)  # the bench holds it to 5%
    texts = {c.generate(str(model), "Once upon a time", max_tokens=32, temperature=0).text()
             for _ in range(3)}  # fmt: skip
    assert len(texts) == 1, texts  # greedy: the same text every time


def test_partial_offload_and_cpu_only(daemon_factory: Callable[..., Any], model: Path) -> None:
    c = daemon_factory().client(timeout=300)
    row = c.load(str(model), n_ctx=4096, parallel=1, gpu_layers=6)
    assert row["gpu_layers"] == 6 and "CPU/GPU" in row["processor"], row
    partial = int(row["size_vram"])
    row = c.load(str(model), n_ctx=4096, parallel=1, gpu_layers=0)  # another ask: a reload
    assert row["processor"] == "100% CPU" and row["size_vram"] == 0, row
    assert probe.gpu_process_memory(int(row["runner_pid"])) in (0, None)  # no CUDA context
    assert partial > 0
    assert c.generate(str(model), "Hello", max_tokens=8, temperature=0).text() is not None


def test_quantized_cache_on_the_card(daemon_factory: Callable[..., Any], model: Path) -> None:
    c = daemon_factory().client(timeout=300)
    f16 = c.load(str(model), n_ctx=32768, parallel=1, kv_cache_type="f16")
    q8 = c.load(str(model), n_ctx=32768, parallel=1, kv_cache_type="q8_0")
    assert q8["kv_cache_type"] == "q8_0" and int(q8["size_vram"]) < int(f16["size_vram"])


def test_tiny_generated_models_too(daemon_factory: Callable[..., Any],
                                   model_factory: Callable[..., Path]) -> None:  # fmt: skip
    """The 7 MB kind of model that segfaulted every runner load on an H100 before the fix."""
    tiny = model_factory("llama", **ggufgen.TINY)
    c = daemon_factory().client(timeout=300)
    for layers in (0, -1):
        row = c.load(str(tiny), gpu_layers=layers)
        assert row["state"] in ("ready", "busy"), row
        assert c.generate(str(tiny), "hi", max_tokens=4).text() is not None


@pytest.fixture(scope="module")
def other(model_factory: Callable[..., Path]) -> Path:
    return model_factory("llama", **dict(SHAPE, seed=3))


def _capped(daemon_factory: Callable[..., Any], model: Path) -> tuple[Any, int]:
    """A daemon whose card budget (vram_cap) holds one such model and half another: the
    plan of one is read on a first daemon."""
    first = daemon_factory().client(timeout=300)
    planned = int(first.load(str(model), n_ctx=4096, parallel=1)["vram_estimate"])
    first.unload(all=True)
    cap = planned + planned // 2
    return daemon_factory(env={"MODELD_VRAM_CAP": str(cap)}).client(timeout=300), planned


def test_a_second_model_beside_a_pinned_one_goes_partly_to_ram(
    daemon_factory: Callable[..., Any], model: Path, other: Path
) -> None:
    c, planned = _capped(daemon_factory, model)
    a = c.load(str(model), n_ctx=4096, parallel=1, pinned=True)
    assert a["processor"] == "100% GPU", a
    b = c.load(str(other), n_ctx=4096, parallel=1)
    assert 0 < b["gpu_layers"] < SHAPE["n_layer"] + 1 and "CPU/GPU" in b["processor"], b
    assert int(b["vram_estimate"]) < planned
    stats = c.stats()
    assert stats["evictions"]["vram"] == 0 and stats["backend"] == "CUDA"
    assert c.generate(str(other), "Hello", max_tokens=8, temperature=0).text() is not None


def test_an_idle_model_is_evicted_when_the_card_is_short(
    daemon_factory: Callable[..., Any], model: Path, other: Path
) -> None:
    c, _ = _capped(daemon_factory, model)
    assert c.load(str(model), n_ctx=4096, parallel=1)["processor"] == "100% GPU"
    b = c.load(str(other), n_ctx=4096, parallel=1)
    assert b["processor"] == "100% GPU", b
    assert c.stats()["evictions"]["vram"] == 1
    assert [r["name"] for r in c.ps() if r["state"] != "unloading"] == [other.stem]

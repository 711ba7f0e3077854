"""The scheduler over RAM and a card, with a fake NVML (tests/fakenvml.py) and the fake
supervisor and clock of test_scheduler (issue 34): the decisions a CUDA build makes, checked
on a machine without one. The runners' llama.cpp is said to have CUDA (a CUDA library beside
llama_cpp before any hello; a hello that lists CUDA0 after), the models are real generated
GGUF files sized by the real estimate and placement."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from fakenvml import FakeCard, FakeNvml
from modeld.cache.policy import EvictionReason, ModelKey
from modeld.daemon import forkserver, views
from modeld.daemon.jobs import Job, request_job
from modeld.errors import ErrorCode
from modeld.model.placement import CUDA_PROCESS_BYTES, VRAM_MARGIN
from modeld.wire import reqparse, runnerwire
from modeld.wire.options import Sampling
from test_scheduler import CLIENT, Harness, make

MiB, GiB = 1 << 20, 1 << 30
#: 8 blocks of 512 wide f32: ~17 MB a layer, so layers (not the CUDA context) fill a card
SHAPE: dict[str, Any] = dict(n_layer=8, n_embd=512, n_head=8, n_ff=2048, n_vocab=512,
                             context_length=2048, dtype="f32")  # fmt: skip
LAYERS = SHAPE["n_layer"] + 1


@pytest.fixture(scope="module")
def models(model_factory: Any) -> tuple[Path, Path]:
    return (Path(model_factory("llama", **dict(SHAPE, seed=1))),
            Path(model_factory("llama", **dict(SHAPE, seed=2))))  # fmt: skip


@pytest.fixture
def card(monkeypatch: pytest.MonkeyPatch) -> FakeCard:
    """One 80 GiB card, empty; llama_cpp has a CUDA library beside it."""
    found = FakeCard("NVIDIA H100", 80 * GiB)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([found]))
    monkeypatch.setattr(forkserver, "gpu_backends", lambda: ["cuda"])
    return found


def load_of(h: Harness, runner_id: str) -> dict[str, Any]:
    return h.sup.messages(runner_id, "load")[-1]


def ready_on_card(h: Harness, card: FakeCard, runner_id: str) -> int:
    """The runner says hello (CUDA0 listed) and loads; NVML then shows its planned bytes."""
    runner = h.sup.runners[runner_id]
    runner.devices = [{"name": "CPU", "type": "cpu"}, {"name": "CUDA0", "type": "gpu"}]
    h.hello(runner_id)
    entry = next(e for e in h.cache.entries() if e.runner_id == runner_id)
    planned = entry.vram[0]
    assert card.processes is not None
    card.processes[runner.pid] = planned
    h.loaded(runner_id)
    return planned


def idle_on_a_card_for_one(card: FakeCard, model: Path) -> tuple[Harness, Any, int]:
    """``model`` loaded on the card and idle; the card then has room for one such model."""
    h = make(budget=8 * GiB)
    job = h.submit(model, "a")
    planned = ready_on_card(h, card, "r1")
    h.done("r1", job.runner_rid)
    card.total = planned + VRAM_MARGIN + planned // 2
    return h, job, planned


def test_the_first_load_goes_on_the_card_before_any_hello(
    card: FakeCard, models: tuple[Path, Path]
) -> None:
    h = make(budget=8 * GiB)
    job = h.submit(models[0], "a")
    load = load_of(h, "r1")  # sent before the runner's hello
    assert load["gpu_layers"] == LAYERS
    assert [d["name"] for d in views.stats(h.sched)["devices"]] == ["CPU", "CUDA0"]  # from NVML
    planned = ready_on_card(h, card, "r1")
    assert planned > CUDA_PROCESS_BYTES
    row = h.sched.row(job.key)
    assert row is not None and row["processor"] == "100% GPU" and row["size_vram"] == planned


def test_a_second_model_beside_a_busy_one_goes_partly_to_ram(
    card: FakeCard, models: tuple[Path, Path]
) -> None:
    h = make(budget=8 * GiB)
    h.submit(models[0], "a", max_tokens=1000)  # stays busy
    planned = ready_on_card(h, card, "r1")
    # another process takes the card but for the first model, the margin and about half of
    # what the second needs (the same shape: the same plan)
    room = CUDA_PROCESS_BYTES + (planned - CUDA_PROCESS_BYTES) // 2
    assert card.processes is not None
    card.processes[999] = card.total - planned - VRAM_MARGIN - room
    second = h.submit(models[1], "b")
    assert not h.sup.stopped  # a busy model is never evicted: fewer layers instead of a wait
    load = load_of(h, "r2")
    assert 0 < load["gpu_layers"] < LAYERS, load
    entry = h.cache.get(second.key)
    assert entry is not None and 0 < entry.vram[0] <= room
    assert entry.estimate_bytes > h.cache.get(h.sched.jobs[next(iter(h.sched.jobs))].key) \
        .estimate_bytes  # type: ignore[union-attr]  # what left the card is charged to RAM
    row = h.sched.row(second.key)
    assert row is not None and "CPU/GPU" in row["processor"]


def test_loads_planned_together_count_each_other_before_they_allocate(
    card: FakeCard, models: tuple[Path, Path]
) -> None:
    h = make(budget=8 * GiB)
    first = h.submit(models[0], "a")
    planned = h.cache.get(first.key).vram[0]  # type: ignore[union-attr]
    room = CUDA_PROCESS_BYTES + (planned - CUDA_PROCESS_BYTES) // 2
    card.total = planned + VRAM_MARGIN + room  # NVML: all free, nothing allocated yet
    second = h.submit(models[1], "b")  # while the first is still loading
    entry = h.cache.get(second.key)
    assert entry is not None and 0 < entry.vram[0] <= room  # not the free figure twice
    assert 0 < load_of(h, "r2")["gpu_layers"] < LAYERS
    assert h.cache.vram_used()[0] <= card.total - VRAM_MARGIN


def test_an_idle_model_holding_the_card_is_evicted_for_vram(
    card: FakeCard, models: tuple[Path, Path]
) -> None:
    h, job, _ = idle_on_a_card_for_one(card, models[0])
    second = h.submit(models[1], "b")
    assert h.sup.stopped == ["r1"]  # evicted for the card, though RAM had room for both
    assert h.cache.stats()["evictions"][EvictionReason.VRAM] == 1
    assert h.sup.spawned == ["r1"]  # waits for its memory: the runner has not exited yet
    h.sup.runners["r1"].popen.code = 0  # type: ignore[attr-defined]
    assert card.processes is not None
    del card.processes[h.sup.runners["r1"].pid]
    h.sched.tick()
    assert h.sup.spawned == ["r1", "r2"]
    assert load_of(h, "r2")["gpu_layers"] == LAYERS
    assert h.cache.get(second.key) is not None
    assert h.cache.get(job.key) is None


def test_the_dry_run_says_which_layers_go_where_and_what_leaves_which_tier(
    card: FakeCard, models: tuple[Path, Path]
) -> None:
    h, job, planned = idle_on_a_card_for_one(card, models[0])
    other = models[1]
    key = type(job.key).for_file(str(other), "generate")
    shown = views.show(h.sched, key, other.stem, None)
    where = shown["placement"]
    assert where["processor"] == "100% GPU" and where["layers"] == {"CUDA0": f"0-{LAYERS - 1}"}
    assert where["kv_cache_type"] == "f16" and where["vram_bytes"][0] > CUDA_PROCESS_BYTES
    assert shown["plan"] == "evict" and "VRAM" in shown["plan_reason"]
    (victim,) = shown["evicts"]
    assert victim["name"] == models[0].stem and victim["reason"] == "vram"
    assert victim["vram_bytes"] == [planned] and victim["ram_bytes"] > 0
    assert not h.sup.stopped  # a dry run
    loaded = views.show(h.sched, job.key, models[0].stem, None)  # the loaded one: where it is
    assert loaded["plan"] == "loaded" and loaded["placement"]["processor"] == "100% GPU"
    # asked for fewer layers: the first blocks stay in RAM
    h.sched.settings.model_options[other.stem] = {"gpu_layers": 4}
    part = views.show(h.sched, key, other.stem, None)["placement"]
    assert part["layers"] == {"RAM": f"0-{LAYERS - 5}", "CUDA0": f"{LAYERS - 4}-{LAYERS - 1}"}
    assert part["processor"] == f"{round(100 * (LAYERS - 4) / LAYERS)}%/" \
        f"{round(100 * 4 / LAYERS)}% CPU/GPU"


def test_num_gpu_on_a_request_places_the_layers_and_reloads_only_for_a_change(
    card: FakeCard, models: tuple[Path, Path]
) -> None:
    """Ollama's ``num_gpu`` (a request's ``gpu_layers``): honoured at the load; the same
    count, or none, reuses the model; another count, or -1 (as many as fit), reloads it."""
    h = make(budget=8 * GiB)
    key = ModelKey.for_file(str(models[0]), "generate")

    def ask(rid: str, layers: int | None) -> Job:
        req = reqparse.GenerateRequest(model=str(models[0]), prompt="hi",
                                       options=reqparse.GenerateOptions(Sampling(max_tokens=2),
                                                                        gpu_layers=layers))
        job = request_job(CLIENT, rid, req, key, models[0].stem, h.sched.settings)
        h.sched.submit(job)
        return job

    first = ask("a", 4)
    assert load_of(h, "r1")["gpu_layers"] == 4
    ready_on_card(h, card, "r1")
    h.done("r1", first.runner_rid)
    for rid, layers in (("b", 4), ("c", None)):
        job = ask(rid, layers)
        h.done("r1", job.runner_rid)  # served by r1: no reload
    assert len(h.sup.messages("r1", "load")) == 1 and h.sup.spawned == ["r1"]
    ask("e", -1)  # as many as fit: another placement
    assert h.cache.stats()["evictions"][EvictionReason.RELOAD] == 1
    h.sup.runners["r1"].popen.code = 0  # type: ignore[attr-defined]
    h.sched.tick()
    assert load_of(h, h.sup.spawned[-1])["gpu_layers"] == LAYERS


def test_stats_name_the_backend_and_each_card(card: FakeCard, models: tuple[Path, Path]) -> None:
    h = make(budget=8 * GiB)
    job = h.submit(models[0], "a")
    planned = ready_on_card(h, card, "r1")
    h.done("r1", job.runner_rid)
    stats = views.stats(h.sched)
    assert stats["backend"] == "CUDA"
    cpu, cuda0 = stats["devices"]
    assert cpu["name"] == "CPU" and "total_bytes" not in cpu
    assert cuda0["name"] == "CUDA0" and cuda0["total_bytes"] == card.total
    assert cuda0["used_bytes"] == cuda0["estimate_bytes"] == planned
    assert cuda0["budget_bytes"] == card.total - VRAM_MARGIN  # only modeld's runner on it
    assert stats["vram_used_bytes"] == [planned]
    shown = views.show(h.sched, job.key, models[0].stem, None)
    assert shown["backend"] == "CUDA" and shown["placement"]["backend"] == "CUDA"


def test_without_a_cuda_build_the_backend_is_the_cpu(models: tuple[Path, Path]) -> None:
    h = make(budget=8 * GiB)
    job = h.serve_one(models[0])
    stats = views.stats(h.sched)
    assert stats["backend"] == "CPU" and stats["vram_budget_bytes"] == []
    assert [d["name"] for d in stats["devices"]] == ["CPU"]
    row = h.sched.row(job.key)
    assert row is not None and row["processor"] == "100% CPU" and row["size_vram"] == 0
    shown = views.show(h.sched, job.key, models[0].stem, None)
    assert shown["placement"]["layers"] == {"RAM": f"0-{LAYERS - 1}"}


def test_vram_cap_bounds_each_cards_budget(card: FakeCard, models: tuple[Path, Path]) -> None:
    h = make(budget=8 * GiB, vram_cap_bytes=800 * MiB)
    job = h.submit(models[0], "a")
    assert h.cache.vram_budgets == (800 * MiB,)  # not the 80 GiB card's
    entry = h.cache.get(job.key)
    assert entry is not None and sum(entry.vram) <= 800 * MiB
    assert 0 < load_of(h, "r1")["gpu_layers"] < LAYERS


def test_a_prompt_that_outgrows_a_model_on_the_card_grows_it_there(
    card: FakeCard, model_factory: Any
) -> None:
    """The growth is sized as the load was: with the layers on the card, not as if every
    layer had to fit in RAM (a RAM budget that could never hold them all refused it)."""
    model = Path(model_factory("llama", **dict(SHAPE, context_length=32768, seed=3)))
    h = make(budget=96 * MiB, ctx_floor=512)
    job = Job(client=CLIENT, rid="L", kind="load", key=ModelKey.for_file(str(model), "generate"),
              name=model.stem, n_ctx=512, parallel=1)
    h.sched.submit(job)
    ready_on_card(h, card, "r1")
    assert load_of(h, "r1")["gpu_layers"] == LAYERS
    a = h.submit(model, "a", max_tokens=64)
    h.runner_says("r1", runnerwire.error(a.runner_rid, ErrorCode.CONTEXT_EXCEEDED, "too long",
                                         {"prompt_tokens": 3000, "n_ctx": 512}))
    assert not [m for j, m in h.replies if j is a], h.replies  # not refused: reloaded
    assert h.sup.stopped == ["r1"]
    h.sup.runners["r1"].popen.code = 0  # type: ignore[attr-defined]  # its memory is free
    h.sched.tick()
    runner = h.sup.spawned[-1]
    assert runner != "r1"
    load = load_of(h, runner)
    assert load["n_ctx"] >= 3072 and load["gpu_layers"] == LAYERS

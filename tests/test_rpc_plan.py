"""Planning a model over llama.cpp RPC workers: the layer split (pure, given numbers), the
largest n_ctx whose every share fits, and, with real workers on loopback, that the plan is
what llama.cpp placed and that a worker's memory bounds the context.

The planned weights and KV cache must equal llama.cpp's reports up to their rounding (it
prints MiB with two decimals: 16 KiB covers it); its compute buffers are estimated (within
30 % here; the formula was fitted on this model and a 4-layer 32k-vocabulary one, where
the worst case, one worker holding everything, plans 23 % high). A CPU worker reports all its
RAM as free, so a small worker is shown with ``rpc_worker_memory`` (the cap modeld plans with,
which also reaches llama.cpp as ``tensor_split``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from modeld import sizing
from modeld.errors import InsufficientMemoryError
from modeld.model import kvcache
from modeld.rpc import layout as rpcplan
from test_rpc_daemon import Worker, needs_rpc, workers  # noqa: F401 (a fixture)

Factory = Callable[..., Any]
GiB = 1 << 30
ROUNDING = 16 << 10


@pytest.fixture(scope="module")
def four_layers(model_factory: Factory) -> Path:
    return Path(model_factory("llama", **dict(ggufgen.TINY, n_layer=4)))


def test_layers_are_cut_at_the_devices_cumulative_shares_as_llama_cpp_does() -> None:
    # 4 blocks + the output layer over two equal workers: llama.cpp logged 0,1,2 -> RPC0 and
    # 3, output -> RPC1 for this split
    assert rpcplan.layer_devices(4, [1.0, 1.0]) == [0, 0, 0, 1, 1]
    assert rpcplan.layer_devices(4, [5.0]) == [0] * 5
    assert rpcplan.layer_devices(4, [1.0, 3.0]) == [0, 0, 1, 1, 1]  # cut at 1/4
    assert rpcplan.layer_devices(4, [0.0, 2.0]) == [1] * 5  # no memory: no layers
    assert rpcplan.layer_devices(3, [1.0, 1.0, 1.0, 1.0]) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        rpcplan.layer_devices(4, [0.0, 0.0])


def test_the_plan_places_every_weight_and_the_whole_kv_cache(four_layers: Path) -> None:
    info = sizing.read_info(str(four_layers))
    shares = rpcplan.plan(info, 1024, ["a:1", "b:2"], [GiB, GiB])
    assert [s.layers for s in shares] == [3, 2]
    embd = sum(t.n_bytes for t in info.tensors if t.name == "token_embd.weight")
    assert sum(s.model_bytes for s in shares) + embd == info.tensor_bytes
    assert sum(s.kv_bytes for s in shares) == kvcache.kv_cache_bytes(info, 1024)
    assert shares[1].compute_bytes > shares[0].compute_bytes  # the logits of a micro-batch
    assert all(s.fits for s in shares)


def test_a_shared_pool_is_planned_as_one_pool_of_n_ctx_cells(four_layers: Path) -> None:
    """kv_unified: the sequences share n_ctx cells, so each worker holds one pool's KV cache
    (not parallel x n_ctx cells) and a larger context fits the same workers."""
    info = sizing.read_info(str(four_layers))
    eps = ["a:1", "b:2"]
    separate = rpcplan.plan(info, 1024, eps, [GiB, GiB], parallel=4)
    pooled = rpcplan.plan(info, 1024, eps, [GiB, GiB], parallel=4, kv_unified=True)
    assert sum(s.kv_bytes for s in separate) == kvcache.kv_cache_bytes(info, 4 * 1024)
    assert sum(s.kv_bytes for s in pooled) == kvcache.kv_cache_bytes(info, 1024)
    assert [s.model_bytes for s in pooled] == [s.model_bytes for s in separate]
    room = max(s.total for s in pooled) + 1
    split = [1.0, 1.0]
    assert rpcplan.fit(info, "m", 1024, 256, eps, [room, room], split, 4, True)[0] == 1024
    assert rpcplan.fit(info, "m", 1024, 256, eps, [room, room], split, 4)[0] < 1024


def test_n_ctx_is_the_largest_whose_every_share_fits(four_layers: Path) -> None:
    info = sizing.read_info(str(four_layers))
    eps = ["10.0.0.5:50052", "10.0.0.6:50052"]
    room = max(s.total for s in rpcplan.plan(info, 1024, eps, [GiB, GiB])) + 1
    small = [GiB, room]  # the second worker binds
    split = [1.0, 1.0]
    assert rpcplan.fit(info, "m", 2048, 256, eps, [GiB, GiB], split)[0] == 2048
    n_ctx, shares = rpcplan.fit(info, "m", 2048, 256, eps, small, split)
    assert n_ctx == 1024 and all(s.fits for s in shares)
    assert not all(s.fits for s in rpcplan.plan(info, 1280, eps, small, split))
    with pytest.raises(InsufficientMemoryError) as exc:  # asked for: not lowered
        rpcplan.fit(info, "m", 2048, None, eps, small, split)
    assert "rpc worker 10.0.0.6:50052" in exc.value.message and "n_ctx 2048" in exc.value.message
    assert exc.value.details["endpoint"] == eps[1]
    assert exc.value.details["memory_bytes"] == room
    with pytest.raises(InsufficientMemoryError):  # the floor does not fit either
        rpcplan.fit(info, "m", 2048, 1536, eps, small, split)


def _close(planned: int, measured: int, share: float = 0.0) -> bool:
    return abs(planned - measured) <= ROUNDING + share * measured


@needs_rpc
def test_the_plan_is_what_llama_cpp_placed_on_one_and_two_workers(
    daemon_factory: Factory, four_layers: Path, workers: Callable[..., Worker]  # noqa: F811
) -> None:
    d = daemon_factory()
    c = d.client()
    w1, w2 = workers(), workers()
    for eps, parallel, pooled in (([w1.endpoint], 1, False), ([w1.endpoint, w2.endpoint], 1, False),
                                  ([w1.endpoint, w2.endpoint], 4, False),
                                  ([w1.endpoint, w2.endpoint], 4, True)):  # fmt: skip
        row = c.load(str(four_layers), rpc=eps, parallel=parallel, kv_unified=pooled)
        assert (row["parallel"], row["kv_unified"]) == (parallel, pooled)
        rpc_rows = [dev for dev in row["devices"] if dev["endpoint"]]
        assert [dev["endpoint"] for dev in rpc_rows] == eps
        for dev in rpc_rows:
            assert dev["plan_memory_bytes"] == dev["total_bytes"]  # a CPU worker: all its RAM
            assert _close(dev["planned_model_bytes"], dev["model_bytes"]), dev
            assert _close(dev["planned_kv_bytes"], dev["kv_bytes"]), dev
            assert _close(dev["planned_compute_bytes"], dev["compute_bytes"], 0.3), dev
        assert sum(dev["planned_layers"] for dev in rpc_rows) == 5
        c.unload(str(four_layers))
        from daemonutil import rows, until

        until(lambda: four_layers.name not in rows(c), 20, "unloaded")
        until(lambda: not c.stats()["rpc_leases"], 20, "leases released")


@needs_rpc
def test_a_workers_memory_bounds_the_context_and_an_asked_one_that_does_not_fit_is_refused(
    daemon_factory: Factory, four_layers: Path, workers: Callable[..., Worker]  # noqa: F811
) -> None:
    info = sizing.read_info(str(four_layers))
    w1, w2 = workers(), workers()
    eps = [w1.endpoint, w2.endpoint]
    cap = max(s.total for s in rpcplan.plan(info, 1024, eps, [GiB, GiB])) + 1
    d = daemon_factory("--parallel", "1", env={
        "MODELD_RPC_WORKER_MEMORY": str(cap), "MODELD_CTX_FLOOR": "512"})  # fmt: skip
    c = d.client()
    with pytest.raises(InsufficientMemoryError) as exc:  # asked for: refused before loading
        c.load(str(four_layers), n_ctx=2048, rpc=eps)
    assert "rpc worker 127.0.0.1:" in exc.value.message and "n_ctx 2048" in exc.value.message
    assert exc.value.details["memory_bytes"] == cap
    row = c.load(str(four_layers), rpc=eps)  # chosen by the daemon (2048): lowered to fit
    assert row["n_ctx"] == 1024, row
    assert "rpc worker's share fits" in str(row["ctx_reason"]), row
    assert {dev["plan_memory_bytes"] for dev in row["devices"] if dev["endpoint"]} == {cap}
    for dev in row["devices"]:
        if dev["endpoint"]:
            assert dev["planned_model_bytes"] + dev["planned_kv_bytes"] + dev[
                "planned_compute_bytes"] <= cap  # fmt: skip
    text = c.generate(str(four_layers), "once upon a time", max_tokens=8, temperature=0.0)
    assert str(text.text())

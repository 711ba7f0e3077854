"""A load onto llama.cpp RPC workers, planned before it registers them: each worker is probed
(version, devices' memory), the model's split over them is planned (:mod:`modeld.rpc.layout`),
and n_ctx is lowered (when the daemon chose it) so that every worker's share fits, or the load
fails with ``insufficient_memory`` naming the worker, before llama.cpp allocates anything."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from modeld import sizing
from modeld.rpc import ggml as ggmlrpc
from modeld.rpc import layout as rpcplan
from modeld.runner import llamaopen
from modeld.runner.specs import LoadSpec

log = logging.getLogger("modeld.runner")


def prepare(spec: LoadSpec) -> tuple[LoadSpec, list[rpcplan.Share]]:
    """(the spec to load with, each worker's planned share); the caller registers them."""
    hellos = ggmlrpc.probe_all(spec.rpc)
    free = [h.free for h in hellos]
    cap = spec.rpc_memory
    memory = [min(f, cap) for f in free] if cap is not None else free
    info = sizing.read_info(spec.path)
    parallel = llamaopen.n_sequences(spec)
    # with a cap, llama.cpp is told to split by it too (tensor_split), so the plan is its split
    split = [float(m) for m in memory]
    n_ctx, shares = rpcplan.fit(
        info, os.path.basename(spec.path), spec.n_ctx, spec.rpc_ctx_floor, spec.rpc, memory,
        split, parallel, spec.kv_unified,
    )  # fmt: skip
    if n_ctx != spec.n_ctx:
        log.info("n_ctx %d -> %d: the largest whose share fits every rpc worker", spec.n_ctx, n_ctx)
    return dataclasses.replace(
        spec, n_ctx=n_ctx, tensor_split=tuple(split) if cap is not None else ()
    ), shares


def with_plan(report: dict[str, Any], shares: list[rpcplan.Share]) -> dict[str, Any]:
    """``ggmlrpc.load_report`` with each worker's planned bytes beside what llama.cpp placed."""
    by_ep = {s.endpoint: s for s in shares}
    for row in report.get("devices", []):
        s = by_ep.get(str(row.get("endpoint")))
        if s is not None:
            row.update(planned_model_bytes=s.model_bytes, planned_kv_bytes=s.kv_bytes,
                       planned_compute_bytes=s.compute_bytes, plan_memory_bytes=s.memory_bytes,
                       planned_layers=s.layers)  # fmt: skip
    return report

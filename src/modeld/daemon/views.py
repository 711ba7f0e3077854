"""What the daemon's service reads of the scheduler: the ``ps`` body, the scheduler's part of
``stats``, ``show``'s document against the live cache, the loaded models and the clients still
waiting. Views, not scheduling: they read the parts' state and decide nothing (the ``ps`` rows
themselves stay with the scheduler, whose load answers carry them)."""

from __future__ import annotations

from typing import Any

from modeld import planning
from modeld.cache.policy import ModelKey
from modeld.daemon.scheduler import Scheduler
from modeld.model import placement


def ps(s: Scheduler) -> dict[str, Any]:
    """The ``ps`` reply body: the rows and the budget."""
    return {
        "models": s.ps_rows(),
        "budget_bytes": s.cache.budget_bytes,
        "used_bytes": s.cache.used_bytes(),
        "max_models": s.cache.max_models,
    }


def stats(s: Scheduler) -> dict[str, Any]:
    """The scheduler's part of ``stats``: the cache's counters, runners and requests."""
    backend, devices = s.admission.devices()  # reads the cards: before the cache's stats
    out: dict[str, Any] = dict(s.cache.stats())
    out.update(
        backend=backend,  # the runners' llama.cpp: CUDA or CPU (rpc_supported: RPC too)
        devices=devices,
        runner_baseline_bytes=s.baseline,
        spare_runner=s.spare is not None,
        fork_server_pid=s.sup.fork_server_pid(),
        # llama.cpp's RPC backend built in (a runner's hello says; None: none said yet)
        rpc_supported=s.pool.rpc_supported,
        rpc_leases={lease.endpoint: lease.model for lease in s.admission.leases.all()},
        in_flight=len(s.jobs),
        waiting=s.admission.queued(),
    )
    return out


def show(s: Scheduler, key: ModelKey, name: str, n_ctx: int | None) -> dict[str, Any]:
    """``show``'s document planned against the live cache, with the loaded row if any."""
    slot = s.slots.get(key)
    out = planning.show_data(
        s.model_info(key), key, name, s.cache, s.baseline, s.settings, n_ctx,
        None if slot is None else (slot.parallel, slot.parallel_reason),
        s.admission.where(key, name, []),
        None if slot is None else slot.mmproj or "",  # what it loaded with (load --mmproj)
        slot.kv_unified if slot is not None else s.admission.unified(key, name, []),
    )  # fmt: skip
    if slot is not None and out.get("plan") == "loaded":
        out["placement"] = placement.describe(slot.placement, slot.kv_type)
        if slot.rpc:
            out["placement"]["backend"] = "RPC"
    out["backend"], out["devices"] = s.admission.devices()  # the daemon's
    out["loaded"] = s.row(key) if slot is not None else None
    return out


def loaded(s: Scheduler) -> dict[ModelKey, str]:
    """The models loaded or loading, with the names they were asked for."""
    return {key: slot.name for key, slot in s.slots.items()}


def clients_waiting(s: Scheduler) -> set[bytes]:
    """Clients with requests in flight that have not gone away."""
    return {job.client for job in s.jobs.values() if not job.client_gone}

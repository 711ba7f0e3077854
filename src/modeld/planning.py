"""What ``modeld show`` would do for a model, planned against a cache: the context it would get
and why, the estimate at that context, and what it would evict or reload.

Pure planning (no I/O): the daemon calls :func:`show_data` with its live cache and the CLI, with
no daemon running, with an empty one (:func:`modeld.describe.describe_local`), so both answer the
same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modeld import projector, sizing
from modeld.cache.policy import CachePolicy, Entry, EvictionReason, ModelKey
from modeld.config import Settings
from modeld.errors import ModeldError, format_bytes
from modeld.model import ctx, memory, placement
from modeld.model.modelinfo import ModelInfo
from modeld.model.placement import Where


def show_data(
    info: ModelInfo,
    key: ModelKey,
    name: str,
    cache: CachePolicy,
    baseline: int,
    settings: Settings,
    n_ctx: int | None = None,
    loaded_parallel: tuple[int, str] | None = None,
    where: Where | None = None,
    mmproj: str | None = None,
    unified: bool = False,
) -> dict[str, Any]:
    """The show document for ``key`` planned against ``cache`` (not mutated);
    ``loaded_parallel``: (N, why) of the loaded model, when it is (the daemon knows it);
    ``where``: its KV cache type and the room on each card (None: CPU only, f16);
    ``mmproj``: the image projector it was loaded with ("": none; None: the one it would
    find, :func:`projector.find`); ``unified``: the sequences share one pool of n_ctx cells
    (the loaded model's layout, else what a load would get)."""
    out: dict[str, Any] = {
        "name": name,
        "path": key.path,
        "mode": key.mode,
        "info": info.summary(),
        "budget_bytes": cache.budget_bytes,
        "runner_baseline_bytes": baseline,
    }
    requested = None if n_ctx is None else ctx.round_up(n_ctx)
    vision = 0
    try:  # the image projector it loads with (issue 38)
        proj = projector.find(Path(key.path), info, name, settings, mmproj) \
            if key.mode == "generate" else None  # fmt: skip
    except ModeldError as exc:
        out["mmproj_error"] = exc.to_dict()
        proj = None
    if proj is not None:
        vision = projector.memory_bytes(proj, info.embedding_length)
        out.update(mmproj=proj.path, mmproj_bytes=vision)
    loaded = cache.get(key)
    if loaded is not None and (requested is None or requested <= loaded.n_ctx):
        out.update(_already_loaded(info, loaded, name, settings, loaded_parallel or (1, ""),
                                   unified))
        return _with_max(out, info, key, cache, baseline, settings)
    workers = settings.rpc.get(name)  # the config puts this name on llama.cpp RPC workers
    if workers:
        out["rpc"] = list(workers)
    try:
        size = sizing.size_for(info, key.mode, cache, key, baseline, requested, settings,
                               offload=bool(workers), where=where, projector=vision,
                               unified=unified)  # fmt: skip
    except ModeldError as exc:
        out["fits"] = False
        out["error"] = exc.to_dict()
        return out
    plan = cache.plan(key, size.need_bytes, size.placement.vram)
    out.update(
        fits=plan.action != "refuse",
        n_ctx=size.n_ctx,
        ctx_reason=size.reason,
        parallel=size.parallel,
        parallel_reason=size.parallel_reason,
        kv_unified=size.kv_unified,
        estimate_bytes=size.estimate_bytes,
        need_bytes=size.need_bytes,
        estimate=sizing.breakdown(info, size.n_ctx, key.mode, settings, size.parallel,
                                  offload=bool(workers), where=where, unified=size.kv_unified),
        naive_estimate_bytes=memory.naive_estimate(info, size.n_ctx),
        plan=plan.action,
        plan_reason=plan.reason,
        would_evict=[v.name for v in plan.victims if v != key],
        evicts=[_victim(cache, v, plan.victim_reason(v)) for v in plan.victims if v != key],
        placement=placement.describe(size.placement, size.kv_type),
    )
    if workers:
        out["rpc_shares"] = _rpc_shares(info, size.n_ctx, size.parallel, workers, settings,
                                        size.kv_unified)
        out["placement"]["backend"] = "RPC"
    if loaded is not None and plan.action != "refuse":
        out.update(_reload(loaded, name, size.n_ctx, size.need_bytes, plan.action, out))
    return _with_max(out, info, key, cache, baseline, settings)


def _victim(cache: CachePolicy, key: ModelKey, reason: EvictionReason) -> dict[str, Any]:
    """A model the plan evicts: why (``memory``: RAM, ``vram``: a card, ``slots``, ``reload``)
    and what it frees in each tier."""
    entry = cache.get(key)
    return {"name": key.name, "reason": reason.value,
            "ram_bytes": entry.accounted_bytes if entry else 0,
            "vram_bytes": list(entry.accounted_vram) if entry else []}  # fmt: skip


def _with_max(out: dict[str, Any], info: ModelInfo, key: ModelKey, cache: CachePolicy,
              baseline: int, settings: Settings) -> dict[str, Any]:
    """Add ``n_ctx_max``: the context a long prompt can grow this model to (its training
    context, or what fits in the budget beside pinned models), at least ``n_ctx``. What an
    agent is told to compact before (``modeld launch``)."""
    if key.mode != "generate" or not isinstance(out.get("n_ctx"), int):
        return out
    grown = sizing.max_context(info, key.mode, cache, key, baseline, settings,
                               int(out.get("parallel") or 1),
                               unified=bool(out.get("kv_unified")))  # fmt: skip
    if info.context_length > 0:
        grown = min(grown, ctx.round_down(info.context_length))
    out["n_ctx_max"] = max(int(out["n_ctx"]), grown)
    return out


def _rpc_shares(
    info: ModelInfo, n_ctx: int, parallel: int, workers: tuple[str, ...], settings: Settings,
    kv_unified: bool,
) -> list[dict[str, Any]]:
    """Each worker's planned share at ``n_ctx``, split as llama.cpp would between workers of
    equal memory (their free memory is asked when the model loads; ``memory_bytes`` is the
    ``rpc_worker_memory`` cap, None without one)."""
    from modeld.rpc import layout as rpcplan

    cap = settings.rpc_worker_memory_bytes
    mem = [cap if cap is not None else 1 << 62] * len(workers)
    return [{"endpoint": s.endpoint, "layers": s.layers, "model_bytes": s.model_bytes,
             "kv_bytes": s.kv_bytes, "compute_bytes": s.compute_bytes, "memory_bytes": cap,
             "fits": s.fits}
            for s in rpcplan.plan(info, n_ctx, workers, mem, parallel=parallel,
                                  kv_unified=kv_unified)]  # fmt: skip


def _already_loaded(
    info: ModelInfo, entry: Entry, name: str, settings: Settings, parallel: tuple[int, str],
    unified: bool = False,
) -> dict[str, Any]:
    """A model loaded with enough context: the dry run plans nothing (it is never its own
    victim); the figures are the entry's own."""
    unified = unified and parallel[0] > 1
    estimate = sizing.breakdown(info, entry.n_ctx, entry.key.mode, settings, parallel[0],
                                unified=unified)
    return {
        "fits": True,
        "n_ctx": entry.n_ctx,
        "ctx_reason": entry.ctx_reason,
        "parallel": parallel[0],
        "parallel_reason": parallel[1],
        "kv_unified": unified,
        "estimate_bytes": estimate["total"],
        "need_bytes": 0,
        "accounted_bytes": entry.accounted_bytes,
        "measured_bytes": entry.measured_bytes,
        "estimate": estimate,
        "naive_estimate_bytes": memory.naive_estimate(info, entry.n_ctx),
        "plan": "loaded",
        "plan_reason": f"{name} is already loaded ({entry.state.value}) with n_ctx "
        f"{entry.n_ctx}: nothing to load or evict",
        "would_evict": [],
    }


def _reload(
    entry: Entry, name: str, n_ctx: int, need: int, action: str, out: dict[str, Any]
) -> dict[str, Any]:
    """A loaded model asked for a larger context is reloaded: say what that frees and costs."""
    others = out["would_evict"]
    freed = entry.accounted_bytes
    why = (
        f"reload {name} with n_ctx {n_ctx} (loaded with {entry.n_ctx}): frees "
        f"{format_bytes(freed)}, needs {format_bytes(need)}"
    )
    if entry.load_seconds is not None:
        why += f", last load took {entry.load_seconds:.2f} s"
    if others:
        why += f"; also evicts {', '.join(others)}"
    if action == "wait":
        why += f"; waits: {out['plan_reason']}"
    return {
        "plan": "reload" if action != "wait" else "wait",
        "plan_reason": why,
        "reload": {
            "from_n_ctx": entry.n_ctx,
            "to_n_ctx": n_ctx,
            "frees_bytes": freed,
            "needs_bytes": need,
            "last_load_seconds": entry.load_seconds,
        },
    }

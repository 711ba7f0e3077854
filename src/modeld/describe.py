"""What ``modeld show`` and ``modeld list`` report, computed the same way in the daemon and the CLI.

``show_data`` is the one definition of a model's "show" document: metadata, the context it would
get now and why, the estimate at that context, and what would be evicted. The daemon calls it
with its live cache; the CLI calls :func:`describe`, which asks a running daemon (so the answer
accounts for the models it holds) and otherwise plans against an empty cache locally.
"""

from __future__ import annotations

import time
from typing import Any

from modeld import ctx, memory
from modeld.cache.policy import CachePolicy, Entry, ModelKey
from modeld.config import Settings
from modeld.daemon import sizing
from modeld.errors import DaemonUnavailableError, ModeldError, format_bytes
from modeld.modelinfo import ModelInfo


def show_data(
    info: ModelInfo,
    key: ModelKey,
    name: str,
    cache: CachePolicy,
    baseline: int,
    settings: Settings,
    n_ctx: int | None = None,
    loaded_parallel: tuple[int, str] | None = None,
) -> dict[str, Any]:
    """The show document for ``key`` planned against ``cache`` (not mutated);
    ``loaded_parallel``: (N, why) of the loaded model, when it is (the daemon knows it)."""
    out: dict[str, Any] = {
        "name": name,
        "path": key.path,
        "mode": key.mode,
        "info": info.summary(),
        "budget_bytes": cache.budget_bytes,
        "runner_baseline_bytes": baseline,
    }
    requested = None if n_ctx is None else ctx.round_up(n_ctx)
    loaded = cache.get(key)
    if loaded is not None and (requested is None or requested <= loaded.n_ctx):
        out.update(_already_loaded(info, loaded, name, settings, loaded_parallel or (1, "")))
        return out
    try:
        size = sizing.size_for(info, key.mode, cache, key, baseline, requested, settings)
    except ModeldError as exc:
        out["fits"] = False
        out["error"] = exc.to_dict()
        return out
    plan = cache.plan(key, size.need_bytes)
    out.update(
        fits=plan.action != "refuse",
        n_ctx=size.n_ctx,
        ctx_reason=size.reason,
        parallel=size.parallel,
        parallel_reason=size.parallel_reason,
        estimate_bytes=size.estimate_bytes,
        need_bytes=size.need_bytes,
        estimate=sizing.breakdown(info, size.n_ctx, key.mode, settings, size.parallel),
        naive_estimate_bytes=memory.naive_estimate(info, size.n_ctx),
        plan=plan.action,
        plan_reason=plan.reason,
        would_evict=[v.name for v in plan.victims if v != key],
    )
    if loaded is not None and plan.action != "refuse":
        out.update(_reload(loaded, name, size.n_ctx, size.need_bytes, plan.action, out))
    return out


def _already_loaded(
    info: ModelInfo, entry: Entry, name: str, settings: Settings, parallel: tuple[int, str]
) -> dict[str, Any]:
    """A model loaded with enough context: the dry run plans nothing (it is never its own
    victim); the figures are the entry's own."""
    estimate = sizing.breakdown(info, entry.n_ctx, entry.key.mode, settings, parallel[0])
    return {
        "fits": True,
        "n_ctx": entry.n_ctx,
        "ctx_reason": entry.ctx_reason,
        "parallel": parallel[0],
        "parallel_reason": parallel[1],
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


def describe(
    settings: Settings, ref: str | None, *, mode: str | None = None, n_ctx: int | None = None
) -> dict[str, Any]:
    """``modeld show``: from the running daemon if there is one, else planned locally
    (``mode`` None: what the model is made for)."""
    from modeld import paths, registry
    from modeld.socketcheck import socket_problem

    ref = registry.normalize_ref(ref) if ref is not None else None
    sock = paths.ipc_path(settings.socket)
    if sock is None or socket_problem(str(sock)) is None:
        from modeld.client import Client

        client = Client(settings.socket, timeout=30.0, connect_timeout=0.5)
        try:
            data = client.show(ref, mode=mode, n_ctx=n_ctx)
            data.setdefault("source", "daemon")
            return data
        except DaemonUnavailableError:
            pass
        finally:
            client.close()
    return describe_local(settings, ref, mode=mode, n_ctx=n_ctx)


def describe_local(
    settings: Settings, ref: str | None, *, mode: str | None = None, n_ctx: int | None = None
) -> dict[str, Any]:
    """The show document with no daemon: an empty cache with the configured budget."""
    from modeld import gguf, registry

    resolved = registry.resolve(ref, settings)
    info = gguf.read_model_info(resolved.path)
    mode = mode or info.natural_mode
    key = ModelKey.for_file(resolved.path, memory.mode_of(mode))
    budget, _usable = sizing.memory_budget(settings)
    cache = CachePolicy(budget, settings.max_models, time.monotonic)
    data = show_data(info, key, resolved.name, cache, memory.RUNNER_BASELINE, settings, n_ctx)
    data["source"] = "local (no daemon running)"
    return data


def list_models(settings: Settings) -> dict[str, Any]:
    """``modeld list``: models dir files and aliases, with architecture and quantisation."""
    from modeld import gguf, registry

    rows: list[dict[str, Any]] = []
    listed_default = registry.listed_default()
    from modeld.pull.store import tag_of

    for listed in registry.list_models(settings):
        row = listed.to_dict()
        hub_name, digest = tag_of(str(listed.path), listed.name)  # pulled: how, and its hash
        pulled = listed.source == "models_dir" and digest is not None
        row.update(hub_name=hub_name if pulled else None,
                   sha256=digest if pulled else None)  # fmt: skip
        try:
            info = gguf.read_model_info(listed.path)
            row.update(architecture=info.architecture, quantization=info.quantization)
        except ModeldError as exc:
            row.update(architecture=None, quantization=None, error=exc.message)
        rows.append(row)
    if listed_default is not None:  # as `ollama list` shows every model it can run
        row = listed_default.to_dict()
        row.update(architecture=None, quantization=None)  # until its first use assembles it
        if listed_default.path.is_file():
            try:
                info = gguf.read_model_info(listed_default.path)
                row.update(architecture=info.architecture, quantization=info.quantization)
            except ModeldError as exc:
                row.update(error=exc.message)
        rows.append(row)
    return {"models_dir": str(settings.models_dir), "models": rows}

"""What ``modeld show`` and ``modeld list`` report, computed the same way in the daemon and the CLI.

``show_data`` is the one definition of a model's "show" document: metadata, the context it would
get now and why, the estimate at that context, and what would be evicted. The daemon calls it
with its live cache; the CLI calls :func:`describe`, which asks a running daemon (so the answer
accounts for the models it holds) and otherwise plans against an empty cache locally.
"""

from __future__ import annotations

import time
from typing import Any

from modeld import memory
from modeld.cache.policy import CachePolicy, ModelKey
from modeld.config import Settings
from modeld.daemon import sizing
from modeld.errors import DaemonUnavailableError, ModeldError
from modeld.modelinfo import ModelInfo


def show_data(
    info: ModelInfo,
    key: ModelKey,
    name: str,
    cache: CachePolicy,
    baseline: int,
    settings: Settings,
    n_ctx: int | None = None,
) -> dict[str, Any]:
    """The show document for ``key`` planned against ``cache`` (not mutated)."""
    out: dict[str, Any] = {
        "name": name,
        "path": key.path,
        "mode": key.mode,
        "info": info.summary(),
        "budget_bytes": cache.budget_bytes,
        "runner_baseline_bytes": baseline,
    }
    requested = None if n_ctx is None else sizing.round_up(n_ctx)
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
        estimate_bytes=size.estimate_bytes,
        need_bytes=size.need_bytes,
        estimate=sizing.breakdown(info, size.n_ctx, key.mode, settings),
        naive_estimate_bytes=memory.naive_estimate(info, size.n_ctx),
        plan=plan.action,
        plan_reason=plan.reason,
        would_evict=[v.name for v in plan.victims],
    )
    return out


def describe(
    settings: Settings, ref: str | None, *, mode: str = "generate", n_ctx: int | None = None
) -> dict[str, Any]:
    """``modeld show``: from the running daemon if there is one, else planned locally."""
    from modeld import paths, registry

    ref = registry.normalize_ref(ref) if ref is not None else None
    sock = paths.ipc_path(settings.socket)
    if sock is None or sock.exists():
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
    settings: Settings, ref: str | None, *, mode: str = "generate", n_ctx: int | None = None
) -> dict[str, Any]:
    """The show document with no daemon: an empty cache with the configured budget."""
    from modeld import gguf, registry

    resolved = registry.resolve(ref, settings)
    info = gguf.read_model_info(resolved.path)
    key = ModelKey.for_file(resolved.path, "embed" if mode == "embed" else "generate")
    budget, _usable = sizing.memory_budget(settings)
    cache = CachePolicy(budget, settings.max_models, time.monotonic)
    data = show_data(info, key, resolved.name, cache, memory.RUNNER_BASELINE, settings, n_ctx)
    data["source"] = "local (no daemon running)"
    return data


def list_models(settings: Settings) -> dict[str, Any]:
    """``modeld list``: models dir files and aliases, with architecture and quantisation."""
    from modeld import gguf, registry

    rows: list[dict[str, Any]] = []
    for listed in registry.list_models(settings):
        row = listed.to_dict()
        try:
            info = gguf.read_model_info(listed.path)
            row.update(architecture=info.architecture, quantization=info.quantization)
        except ModeldError as exc:
            row.update(architecture=None, quantization=None, error=exc.message)
        rows.append(row)
    return {"models_dir": str(settings.models_dir), "models": rows}

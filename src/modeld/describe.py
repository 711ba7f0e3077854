"""What ``modeld show`` and ``modeld list`` report to the CLI and the HTTP APIs.

:func:`describe` asks a running daemon (so the answer accounts for the models it holds) and
otherwise plans against an empty cache locally with :func:`modeld.planning.show_data`, the one
definition of a model's "show" document that the daemon uses too.
"""

from __future__ import annotations

import time
from typing import Any

from modeld import sizing
from modeld.cache.policy import CachePolicy, ModelKey
from modeld.config import Settings
from modeld.errors import DaemonUnavailableError, ModeldError
from modeld.model import memory
from modeld.planning import show_data


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
    from modeld import registry
    from modeld.model import gguf

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
    from modeld import registry
    from modeld.model import gguf

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

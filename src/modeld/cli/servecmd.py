"""``modeld serve`` and ``modeld stop``: the daemon in the foreground, and asking it to stop.
Only typer and the standard library at the top (CLI start-up time)."""

from __future__ import annotations

from typing import Annotated

import typer

from modeld.cli.opts import GpuOpt, JsonOpt, KeepAliveOpt, KvOpt, UnifiedOpt
from modeld.cli.opts import connect as _client
from modeld.cli.opts import settings_with as _settings


def serve(
    socket: Annotated[
        str | None, typer.Option(help="ZeroMQ endpoint to bind (ipc://… or tcp://…).")
    ] = None,
    memory_fraction: Annotated[
        float | None, typer.Option(help="Share of usable memory the cache may use (0-1).")
    ] = None,
    memory_cap: Annotated[
        str | None, typer.Option(help='Absolute cap on the cache budget, e.g. "8GiB".')
    ] = None,
    max_models: Annotated[int | None, typer.Option(help="Most models loaded at once.")] = None,
    keep_alive: KeepAliveOpt = None,
    preload: Annotated[
        list[str] | None, typer.Option("--preload", help="Load this model at start (repeatable).")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
    prompt_cache_mib: Annotated[
        int | None,
        typer.Option(help="Prompt-state cache per generating model, in MiB (0: off)."),
    ] = None,
    draft_max: Annotated[
        int | None,
        typer.Option("--draft-max", "--draft",
                     help="Most tokens a reply drafts from its context per step (0: off)."),
    ] = None,
    runner_stall: Annotated[
        float | None,
        typer.Option(help="Kill a runner that sends no heartbeat for this many seconds."),
    ] = None,
    http: Annotated[
        str | None,
        typer.Option(help='HTTP front door (Ollama, OpenAI, Anthropic): "HOST:PORT" or "off".'),
    ] = None,
    parallel: Annotated[
        int | None,
        typer.Option(help="Requests one model decodes together (0: auto, 4 if memory allows)."),
    ] = None,
    kv_unified: UnifiedOpt = None,
    kv_cache_type: KvOpt = None,
    gpu_layers: GpuOpt = None,
) -> None:
    """Run the daemon in the foreground (stop it with Ctrl-C, SIGTERM or modeld stop)."""
    from modeld.daemon import server as daemon

    settings = _settings(
        socket=socket,
        memory_fraction=memory_fraction,
        memory_cap_bytes=memory_cap,
        max_models=max_models,
        keep_alive=keep_alive,
        log_level=log_level,
        prompt_cache_mib=prompt_cache_mib,
        draft_max=draft_max,
        runner_stall_s=runner_stall,
        http=http,
        parallel=parallel,
        kv_unified=kv_unified,
        kv_cache_type=kv_cache_type,
        gpu_layers=gpu_layers,
    )
    if preload:
        from modeld.cli.autostart import preload_in_background

        preload_in_background(settings, preload)
    raise typer.Exit(daemon.serve(settings))


def stop(json_out: JsonOpt = False) -> None:
    """Stop the running daemon (models are unloaded, in-flight requests are told)."""
    from modeld.cli import render

    reply = _client().shutdown()
    if json_out:
        render.emit_json("stop", {"stopped": True, **reply})
    else:
        render.message("modeld: daemon stopping")

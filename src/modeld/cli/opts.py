"""What the commands share: their option types and how a command reaches its settings and the
daemon. Only typer and the standard library at the top (CLI start-up time)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from modeld.client import Client
    from modeld.config import Settings

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document (for scripts).")]
ModelArg = Annotated[
    str | None,
    typer.Argument(
        help="A .gguf path, a name in the models dir, or an alias; default model if omitted."
    ),
]
KeepAliveOpt = Annotated[
    str | None,
    typer.Option("--keep-alive", help='How long to keep the model loaded: "5m", seconds, 0, -1.'),
]
CtxOpt = Annotated[int | None, typer.Option("--ctx", help="Context length (rounded up to 256).")]
KvOpt = Annotated[str | None, typer.Option(
    "--kv-cache-type", help="KV cache type: f16, q8_0 or q4_0 (default: the config's).")]
UnifiedOpt = Annotated[bool | None, typer.Option(
    "--kv-unified/--kv-separate", help="The parallel requests share one pool of n_ctx cells "
    "(one may use it all), or each has its own (default: the config's).")]
GpuOpt = Annotated[str | None, typer.Option(
    "--gpu-layers", help="Layers on the GPUs: N, auto or 0 (CPU only; default: the config's).")]
RpcOpt = Annotated[
    str | None,
    typer.Option(
        "--rpc",
        help="llama.cpp RPC workers HOST:PORT[,HOST:PORT]: every layer goes to them "
        "(modeld rpc-worker; docs/rpc.md).",
    ),
]
MmprojOpt = Annotated[
    str | None,
    typer.Option("--mmproj", help="The model's image projector (mmproj .gguf; default: the one "
                 "beside the model or in the config; '' for none)."),
]
NoPullOpt = Annotated[
    bool,
    typer.Option("--no-pull", help="Never pull a missing hf.co/… model (MODELD_NO_PULL=1)."),
]


def settings_with(**overrides: Any) -> Settings:
    """The settings, with the options a command was given (None: not given) on top."""
    from modeld.config import load_settings

    settings, _ = load_settings({k: v for k, v in overrides.items() if v is not None})
    return settings


def connect(settings: Settings | None = None, *, autostart: bool = False) -> Client:
    """A connected client; with ``autostart`` a missing daemon is started in the background."""
    from modeld.client import Client
    from modeld.errors import DaemonUnavailableError

    settings = settings or settings_with()
    client = Client(settings.socket, timeout=None)
    try:
        client.ping()
        return client
    except DaemonUnavailableError as exc:
        client.close()
        if not autostart or os.environ.get("MODELD_NO_AUTOSTART") in ("1", "true", "yes"):
            raise
        if exc.details.get("reason") in ("permission", "not_a_socket", "os_error"):
            raise  # a daemon started now could not take that path either
    from modeld.cli.autostart import start_daemon

    start_daemon(settings)
    client = Client(settings.socket, timeout=None)
    client.ping()
    return client



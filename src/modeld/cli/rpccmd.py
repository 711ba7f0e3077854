"""``modeld rpc-worker``: lend this machine's memory to another machine's modeld (llama.cpp RPC).

The worker is llama.cpp's own RPC server (``ggml_backend_rpc_start_server``) called through
llama-cpp-python's library, in this process: no other binary. It blocks inside llama.cpp with
the GIL released, so it runs in a thread while the main thread waits for Ctrl-C or SIGTERM and
then ends the process (the server has no stop call; its clients see the connection close).
Only typer and the standard library are imported at the top (CLI start-up time).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from typing import Annotated

import typer


def rpc_worker(
    host: Annotated[
        str,
        typer.Option(help="Address to listen on; beyond loopback needs --allow-insecure-network."),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port to listen on.")] = 50052,
    device: Annotated[
        str, typer.Option(help="ggml device to lend: CPU, or a GPU such as CUDA0.")
    ] = "CPU",
    threads: Annotated[
        int | None, typer.Option(min=1, help="CPU threads for its work (default: all usable).")
    ] = None,
    cache: Annotated[
        str | None,
        typer.Option(help="Directory caching large tensors across loads (none by default)."),
    ] = None,
    allow_insecure_network: Annotated[
        bool,
        typer.Option(
            "--allow-insecure-network",
            help="Listen beyond loopback (no authentication, no encryption: trusted LANs only).",
        ),
    ] = False,
) -> None:
    """Serve this machine's memory to a model loaded elsewhere with --rpc (llama.cpp RPC)."""
    from modeld.errors import InvalidRequestError, RpcWorkerError
    from modeld.model import probe
    from modeld.rpc import endpoints as rpc

    asked, host = host, rpc.listen_address(host)  # what llama.cpp's server can listen on
    if not rpc.is_loopback(host):
        if not allow_insecure_network:
            raise InvalidRequestError(
                f"refusing to listen on {asked}: an RPC worker has no authentication and no "
                "encryption, and runs whatever it is sent",
                hint="keep --host 127.0.0.1 and reach it through an SSH or WireGuard tunnel, "
                "or pass --allow-insecure-network on a trusted network",
            )
        print(rpc.INSECURE_WARNING, file=sys.stderr, flush=True)
    try:  # a taken port is a clear error here (llama.cpp would only print and return)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe_sock:
            probe_sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe_sock.bind((host, port))
    except OSError as exc:
        raise RpcWorkerError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="choose another --port, or stop what uses it",
            details={"endpoint": f"{host}:{port}", "problem": "listen"},
        ) from exc
    from modeld.rpc import ggml as ggmlrpc

    ggmlrpc.device(device)  # an unknown device is an error before "serving" is printed
    n_threads = threads or max(1, int(probe.cpu_threads()))
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            ggmlrpc.serve(f"{host}:{port}", device, n_threads, cache)
        except BaseException as exc:
            failure.append(exc)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"modeld rpc-worker: serving {device} on {host}:{port} with {n_threads} threads "
          "(Ctrl-C stops it)", file=sys.stderr, flush=True)  # fmt: skip
    worker = threading.Thread(target=serve, name="rpc-server", daemon=True)
    worker.start()
    while worker.is_alive() and not stop.wait(0.2):
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    if stop.is_set():
        print("modeld rpc-worker: stopped", file=sys.stderr, flush=True)
        os._exit(0)  # the server thread is inside llama.cpp and has no stop call
    if failure and isinstance(failure[0], RpcWorkerError):
        raise failure[0]
    raise RpcWorkerError(
        f"the rpc worker on {host}:{port} stopped: "
        + (str(failure[0]) if failure else "llama.cpp's server returned (see its output above)"),
        hint="check the address and port",
        details={"endpoint": f"{host}:{port}", "problem": "serve"},
    )

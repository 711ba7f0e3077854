"""The runner process's entry point: arguments, logging, signals, llama.cpp's backends in the
order a CUDA build loads in, then :class:`modeld.runner.process.Runner` until shutdown.

Started by the daemon as ``python -m modeld.runner --endpoint EP --id RUNNER_ID`` (or forked
from the runner fork server, :mod:`modeld.runner.zygote`)."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from modeld.runner import openmp, preload

openmp.settle()  # before llama.cpp's libgomp loads: it reads its environment once
preload.preload()  # MODELD_RUNNER_PRELOAD: libraries in the global scope before llama.cpp's

import llama_cpp  # noqa: E402

from modeld.rpc import ggml as ggmlrpc  # noqa: E402
from modeld.runner.llamalog import install_llama_logging, llama_logger  # noqa: E402
from modeld.runner.process import Runner  # noqa: E402
from modeld.runner.transport import connect, heartbeats  # noqa: E402


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m modeld.runner", description=__doc__)
    p.add_argument("--endpoint", required=True, help="the daemon's runner ROUTER endpoint")
    p.add_argument("--id", required=True, dest="runner_id", help="this runner's identity")
    p.add_argument("--log-level", default=os.environ.get("MODELD_LOG_LEVEL", "INFO"))
    p.add_argument("--parent-pid", type=int, help="the daemon's pid (default: the parent's)")
    p.add_argument("--load-log", help="file for llama.cpp's lines of each load (crash report)")
    return p.parse_args(argv)


def init_native() -> list[dict[str, Any]]:
    """Initialise llama.cpp's backends and list their devices while this process runs one
    thread, before NVML, ZeroMQ's I/O threads or the heartbeat thread exist: the order of a
    plain ``Llama(...)`` process, the one a CUDA build was seen to load in. (Initialised later,
    from the first load or the hello's RPC check, every runner of a CUDA build died with
    SIGSEGV: issue 34; scripts/gpu-check.sh bisects these steps on a card.)"""
    llama_cpp.llama_backend_init()
    return ggmlrpc.devices(memory=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a runner until shutdown or parent death; the exit code is 0 on a clean stop."""
    args = _parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        stream=sys.stderr,
        format=f"%(asctime)s runner[{args.runner_id}] %(name)s %(levelname)s %(message)s",
    )
    # The daemon stops runners with 'shutdown'; a Ctrl-C sent to the terminal's process group
    # must not kill a generation half-way (if the daemon itself dies, the parent check exits).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # llama.cpp's info lines (hundreds per load) only at debug level; warnings always.
    debug = logging.getLogger().getEffectiveLevel() <= logging.DEBUG
    llama_logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    install_llama_logging()
    faulthandler.enable()  # a native crash leaves the Python stack in the runner log
    # CUDA's device numbers in NVML's (PCI) order: the daemon plans each card by NVML's figures
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    devices = init_native()
    # Given by the daemon: a runner started just as the daemon died would otherwise take its
    # new parent (init, pid 1) for the daemon and never exit (seen as orphans after tests).
    parent = args.parent_pid or os.getppid()
    with (connect(args.endpoint, args.runner_id) as sock,
          heartbeats(sock.context, args.endpoint, args.runner_id)):
        runner = Runner(sock, args.runner_id, parent, devices, args.load_log)
        return runner.serve(runner.hello())


if __name__ == "__main__":
    sys.exit(main())

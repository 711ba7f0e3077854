"""Import hygiene: pure policy modules stay pure, and the CLI starts without heavy imports."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from modeld.runner import openmp

PURE_MODULES = [
    "modeld.errors",
    "modeld.model.modelinfo",
    "modeld.wire.protocol",
    "modeld.wire.reqparse",
    "modeld.model.gguf",
    "modeld.model.gguffile",
    "modeld.model.ggufarch",
    "modeld.model.memory",
    "modeld.model.kvcache",
    "modeld.model.ctx",
    "modeld.cache.policy",
    "modeld.config",
    "modeld.registry",
    "modeld.pull.names",
    "modeld.wire.images",
    "modeld.projector",
    "modeld.wire.runnerwire",
    "modeld.wire.requestfields",
    "modeld.wire.loadfields",
    "modeld.wire.replyflow",
    "modeld.sizing",
    "modeld.rpc.layout",
    "modeld.planning",
    "modeld.runner.specs",
    "modeld.wire.replies",
    "modeld.runner.chat",
    "modeld.runner.textstream",
    "modeld.runner.promptplan",
    "modeld.runner.microbatch",
    "modeld.runner.promptcache",
    "modeld.runner.promptfile",
    "modeld.cluster.placement",
    "modeld.cluster.asgi",
    "modeld.schema",
]
NATIVE = ("llama_cpp", "zmq", "psutil", "pynvml", "ray")


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_nothing_native(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        f"bad = [m for m in {NATIVE!r} if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["ps", "--help"]])
def test_cli_start_imports_no_llama_numpy_or_zmq(argv: list[str]) -> None:
    code = (
        "import sys\n"
        "from modeld.cli.app import app\n"
        "try:\n"
        f"    app(args={argv!r}, prog_name='modeld')\n"
        "except SystemExit:\n"
        "    pass\n"
        "bad = [m for m in ('llama_cpp', 'numpy', 'zmq', 'psutil') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "modeld" in out.stdout


def test_runner_loads_libzmq_before_llama_cpp() -> None:
    """With a CUDA build of llama.cpp loaded first, libzmq's I/O thread dies on its first
    message (seen on an H200 machine: every runner exited with SIGSEGV at start); the runner's
    entry point therefore imports zmq first. ``-X importtime`` lists imports in load order."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "modeld.runner", "--help"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    order = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()
             if line.startswith("import time:")]  # fmt: skip
    assert "zmq" in order and "llama_cpp" in order, order[-20:]
    assert order.index("zmq") < order.index("llama_cpp")


def _gomp_spincount(env: dict[str, str]) -> str:
    """The spin count the runner's libgomp took with ``env`` added to this environment less
    any wait setting of its own, as libgomp prints it at load (``OMP_DISPLAY_ENV``); skipped
    for a llama.cpp built without libgomp."""
    base = {k: v for k, v in os.environ.items() if k not in openmp.USER_SETTINGS}
    out = subprocess.run([sys.executable, "-m", "modeld.runner", "--help"], capture_output=True,
                         text=True, timeout=120,
                         env={**base, **env, "OMP_DISPLAY_ENV": "verbose"})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    found = re.search(r"GOMP_SPINCOUNT = '(\d+)'", out.stderr)
    if found is None:
        pytest.skip("this llama.cpp build does not use libgomp")
    return found.group(1)


def test_runner_openmp_threads_spin_briefly_unless_the_user_says() -> None:
    """libgomp reads its environment once, at load: the runner sets the spin count before it
    imports llama_cpp (runner/openmp.py); a user's own setting is kept."""
    assert _gomp_spincount({}) == str(openmp.SPINCOUNT)
    assert _gomp_spincount({"GOMP_SPINCOUNT": "12345"}) == "12345"
    env: dict[str, str] = {"OMP_WAIT_POLICY": "active"}
    openmp.settle(env)
    assert env == {"OMP_WAIT_POLICY": "active"}
    env = {}
    openmp.settle(env)
    assert env == {"GOMP_SPINCOUNT": str(openmp.SPINCOUNT)}

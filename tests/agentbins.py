"""The real agent CLIs for the ``agents`` tests: Claude Code and Codex from npm (their native
binaries come as npm packages), pinned, installed once into a cache directory.

Where: ``$MODELD_TEST_AGENTS_DIR``, else ``$XDG_CACHE_HOME/modeld/test-agents/<pins>`` (about
660 MB; the first install takes about 20 s). Missing node/npm or an unreachable registry is a
skip that says so; an install that fails otherwise is a failure.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

#: npm package -> version, and the command each provides.
PINS = {"@anthropic-ai/claude-code": "2.1.197", "@openai/codex": "0.171.0"}
COMMANDS = ("claude", "codex")


def cache_dir() -> Path:
    env = os.environ.get("MODELD_TEST_AGENTS_DIR")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = hashlib.sha256(repr(sorted(PINS.items())).encode()).hexdigest()[:12]
    return base / "modeld" / "test-agents" / key


def installed(root: Path) -> dict[str, Path] | None:
    bins = {c: root / "node_modules" / ".bin" / c for c in COMMANDS}
    return bins if all(b.exists() for b in bins.values()) else None


def install() -> dict[str, Path]:
    """The two commands' paths, installing them first when the cache lacks them."""
    root = cache_dir()
    bins = installed(root)
    if bins is not None:
        return bins
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not on PATH: the agents tests need Node.js and npm")
    try:
        ping = subprocess.run(["npm", "ping", "--fetch-retries=0", "--fetch-timeout=15000"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        problem = " / ".join(ping.stderr.strip().splitlines()[:2]) if ping.returncode else ""
    except subprocess.TimeoutExpired:
        problem = "no answer in 60 s"
    if problem:
        pytest.skip(f"the npm registry is unreachable (npm ping: {problem})")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".install-", dir=root.parent))
    try:
        done = subprocess.run(
            ["npm", "install", "--prefix", str(staging), "--no-audit", "--no-fund",
             "--loglevel", "error", *(f"{p}@{v}" for p, v in PINS.items())],
            capture_output=True, text=True, timeout=900)  # fmt: skip
        if done.returncode != 0:
            pytest.fail(f"npm install failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        if not root.exists():  # else another run finished first
            os.replace(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    bins = installed(root)
    if bins is None:
        pytest.fail(f"npm installed no {', '.join(COMMANDS)} under {root}")
    return bins

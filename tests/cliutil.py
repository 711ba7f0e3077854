"""Helpers for the CLI integration tests: the real ``modeld`` console script, private dirs.

Every test here talks to the daemon only through the console script in subprocesses, the way a
user or a shell script would. Each :class:`CliEnv` has its own short temp root (ipc socket paths
are limited to ~107 bytes), runtime/log/models dirs and an empty config file, so tests never see
a user's daemon or settings.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemonutil import until

MODELD = str(Path(sys.executable).parent / "modeld")
# Deterministic, short generations on the generated tiny models.
GREEDY = ("--temperature", "0", "--seed", "1")


@dataclass
class CliEnv:
    """A private modeld environment: ``run(...)`` invokes the console script in it."""

    root: Path
    env: dict[str, str]
    serve_proc: subprocess.Popen[bytes] | None = None
    extra_cleanup: list[int] = field(default_factory=list)

    @classmethod
    def create(cls, *, autostart: bool = False) -> CliEnv:
        root = Path(tempfile.mkdtemp(prefix="mdcli-", dir="/tmp"))
        (root / "log").mkdir()
        (root / "models").mkdir()
        (root / "config.toml").touch()
        env = dict(os.environ)
        env.update(
            MODELD_RUNTIME_DIR=str(root / "run"),
            MODELD_SOCKET=f"ipc://{root / 'run' / 'modeld.sock'}",
            MODELD_LOG_DIR=str(root / "log"),
            MODELD_MODELS=str(root / "models"),
            MODELD_PROMPT_CACHE_DIR=str(root / "prompts"),
            MODELD_CONFIG=str(root / "config.toml"),
            MODELD_HTTP="off",  # never Ollama's port 11434 from a test
            MODELD_PROMPT_CACHE_MIB="32",  # fixed, as conftest's daemons (not a budget share)
            NO_COLOR="1",
            PYTHONUNBUFFERED="1",
        )
        env.pop("COLUMNS", None)
        if autostart:
            env.pop("MODELD_NO_AUTOSTART", None)
        else:
            env["MODELD_NO_AUTOSTART"] = "1"  # a dead daemon must fail, not be replaced
        return cls(root, env)

    @property
    def socket_path(self) -> Path:
        return self.root / "run" / "modeld.sock"

    def run(
        self,
        *args: str,
        input: str | bytes | None = None,
        env_extra: dict[str, str] | None = None,
        timeout: float = 120,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``modeld ARGS`` to completion; stdin is ``input`` or /dev/null (not a terminal)."""
        env = dict(self.env, **(env_extra or {}))
        data = input.decode() if isinstance(input, bytes) else input
        return subprocess.run(
            [MODELD, *args],
            input=data,
            stdin=None if data is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            cwd=cwd or self.root,
        )

    def json(self, *args: str, **kw: Any) -> dict[str, Any]:
        """Run ``modeld ARGS --json``, require exit 0 and return the parsed document."""
        out = self.run(*args, "--json", **kw)
        assert out.returncode == 0, (args, out.returncode, out.stderr)
        data: dict[str, Any] = json.loads(out.stdout)
        return data

    def stdout_bytes(self, *args: str, input: str | None = None) -> bytes:
        """Run ``modeld ARGS``, require exit 0, return stdout exactly (no newline translation)."""
        out = subprocess.run(
            [MODELD, *args],
            input=None if input is None else input.encode(),
            stdin=subprocess.DEVNULL if input is None else None,
            capture_output=True,
            env=self.env,
            timeout=120,
            cwd=self.root,
        )
        assert out.returncode == 0, (args, out.returncode, out.stderr.decode(errors="replace"))
        return out.stdout

    def popen(self, *args: str, **kw: Any) -> subprocess.Popen[bytes]:
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("cwd", self.root)
        return subprocess.Popen([MODELD, *args], env=self.env, **kw)

    # ------------------------------------------------------------------ daemon

    @classmethod
    @contextlib.contextmanager
    def served(cls, *args: str) -> Iterator[CliEnv]:
        """A private environment with ``modeld serve ARGS`` running; stopped (and checked) and
        removed on exit."""
        env = cls.create()
        try:
            env.serve(*args)
            yield env
            env.stop_and_check()
        finally:
            env.cleanup()

    def serve(self, *args: str) -> subprocess.Popen[bytes]:
        """``modeld serve ARGS`` in the background; returns once ``modeld ps`` answers."""
        with open(self.root / "log" / "serve.out", "ab") as out:
            proc = self.popen("serve", *args, stdout=out, stderr=subprocess.STDOUT)
        self.serve_proc = proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"modeld serve exited early:\n{self.log_text()}")
            return self.socket_path.exists() and self.run("ps").returncode == 0

        until(ready, timeout=60, what="modeld serve to answer")
        return proc

    def stop_and_check(self) -> None:
        """``modeld stop``: it must succeed, the daemon must exit and remove its socket."""
        out = self.run("stop")
        assert out.returncode == 0, out.stderr
        if self.serve_proc is not None:
            assert self.serve_proc.wait(30) == 0, self.log_text()
        until(lambda: not self.socket_path.exists(), timeout=30, what="socket removed")

    def cleanup(self) -> None:
        """Best effort, for teardown after a failure: never leave a daemon behind."""
        if self.serve_proc is not None and self.serve_proc.poll() is None:
            self.serve_proc.send_signal(signal.SIGTERM)
            try:
                self.serve_proc.wait(20)
            except subprocess.TimeoutExpired:
                self.serve_proc.kill()
                self.serve_proc.wait(5)
        for pid in self.extra_cleanup:
            if pid_alive(pid):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(self.root, ignore_errors=True)

    def log_text(self) -> str:
        parts = []
        for p in sorted((self.root / "log").glob("*")):
            if p.is_file() and not p.name.startswith("runner-"):
                parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)

    def ps_row(self, model: Path, mode: str = "generate") -> dict[str, Any] | None:
        """The ``modeld ps --json`` row of ``model`` (leaving out unloading entries)."""
        for row in self.json("ps")["models"]:
            same = row["path"] == str(model.resolve()) and row["mode"] == mode
            if same and row["state"] != "unloading":
                return dict(row)
        return None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in state

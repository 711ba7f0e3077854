"""What every step of bench/gpu_check.py runs under: its own deadline inside the run's, its
output to a log in the work folder, its status in the results (issue 44)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


class Steps:
    """Each step's status and seconds, under the run's deadline (``reserve`` left to pack)."""

    def __init__(self, out: Path, work: Path, deadline: float, reserve: float = 15.0) -> None:
        self.out, self.work, self.deadline, self.reserve = out, work, deadline, reserve
        self.results: dict[str, Any] = {"steps": {}}
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def left(self, limit: float) -> float:
        return min(limit, self.deadline - self.reserve - time.time())

    def sh(
        self,
        name: str,
        cmd: list[str],
        limit: float,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str] | None:
        """Run ``cmd`` (its output to logs/NAME.log) under ``limit`` or what the run has left."""
        t = self.left(limit)
        if t < 5:
            self.results["steps"][name] = {"status": "skipped: out of time"}
            return None
        t0 = time.time()
        try:
            done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=t)
            status = "ok" if done.returncode == 0 else f"exit {done.returncode}"
        except subprocess.TimeoutExpired as exc:
            done = subprocess.CompletedProcess(cmd, -9, _text(exc.stdout), _text(exc.stderr))
            status = f"timed out after {t:.0f} s"
        (self.logs / f"{name}.log").write_text(f"$ {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")
        self.results["steps"][name] = {"status": status, "seconds": round(time.time() - t0, 1)}
        return done


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _out(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"

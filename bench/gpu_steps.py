"""What every step of bench/gpu_check.py runs under: its own deadline inside the run's, its
output to a log in the work folder, its status in the results (issue 44)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


class Steps:
    """Each step's status and seconds, under the run's deadline (``reserve`` left to pack)."""

    def __init__(self, out: Path, work: Path, deadline: float, reserve: float = 10.0) -> None:
        self.out, self.work, self.deadline, self.reserve = out, work, deadline, reserve
        self.results: dict[str, Any] = {"steps": {}}
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def left(self, limit: float, keep: float = 0.0) -> float:
        """Seconds a step may take: its ``limit``, or what the run has left less the reserve
        and ``keep`` (what a later step needs)."""
        return min(limit, self.deadline - self.reserve - keep - time.time())

    def sh(
        self,
        name: str,
        cmd: list[str],
        limit: float,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        keep: float = 0.0,
    ) -> subprocess.CompletedProcess[str] | None:
        """Run ``cmd`` (its output to logs/NAME.log) under ``limit`` or what the run has left;
        at its deadline its whole process group goes (a daemon and runners it started too)."""
        t = self.left(limit, keep)
        if t < 5:
            self.results["steps"][name] = {"status": "skipped: out of time"}
            return None
        t0 = time.time()
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=t)
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    out, err = proc.communicate(timeout=5)
                    break
            else:
                out, err = proc.communicate()
            status = f"timed out after {t:.0f} s"
        done = subprocess.CompletedProcess(cmd, proc.returncode, out or "", err or "")
        (self.logs / f"{name}.log").write_text(f"$ {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")
        self.results["steps"][name] = {"status": status, "seconds": round(time.time() - t0, 1)}
        return done


def _out(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"

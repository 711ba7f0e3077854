"""What the daemon says when a runner dies while loading: how it died (the signal), on which
llama.cpp backend, and llama.cpp's last lines of that load (the runner writes them to its
``load_log`` file as they come, so they outlive the process).

Why: a native crash of llama.cpp (a CUDA build that segfaults, issue 34) used to be reported as
"the file may be corrupt", which sends users after the wrong cause. An abort (``GGML_ASSERT``)
on a malformed file still is a bad file; a segfault is a crash, and says so.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from modeld.errors import InvalidModelError, ModeldError, RunnerCrashedError

#: lines of the load log quoted in the error (the whole file stays on disk)
TAIL_LINES = 6
_TAIL_BYTES = 64 * 1024


def how_it_ended(code: int | None) -> str:
    """``exited with code 1``, ``was killed by SIGSEGV (signal 11)``, ..."""
    if code is None:
        return "ended"
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "an unknown signal"
    return f"was killed by {name} (signal {-code})"


def backend_of(devices: Sequence[Mapping[str, Any]]) -> str:
    """The backend a runner's hello names: its accelerators' kinds (``CUDA``, ``CUDA+RPC``),
    ``CPU`` when it has none, ``unknown`` when it died before its hello."""
    if not devices:
        return "unknown"
    kinds: list[str] = []
    for dev in devices:
        name = str(dev.get("name", ""))
        if dev.get("type") in ("gpu", "igpu", "accel") or name.startswith("RPC"):
            kind = name.rstrip("0123456789") or "GPU"
            if kind not in kinds:
                kinds.append(kind)
    return "+".join(kinds) if kinds else "CPU"


def tail(path: Path | None, n: int = TAIL_LINES) -> list[str]:
    """The last ``n`` non-empty lines of ``path`` (empty when there is no such file)."""
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - _TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-n:]


def load_crash(
    name: str, path: str, code: int | None, devices: Sequence[Mapping[str, Any]],
    lines: Sequence[str], load_log: Path | None = None,
) -> ModeldError:
    """The error of a load whose runner died: an abort with an assertion is the file's fault
    (``invalid_model``); any other death is a crash (``runner_crashed``) on its backend."""
    backend = backend_of(devices)
    ended = how_it_ended(code)
    said = "; ".join(" ".join(line.split()) for line in lines) or "nothing"
    details: dict[str, Any] = {
        "exit_code": code, "path": path, "backend": backend, "last_lines": list(lines),
        "load_log": str(load_log) if load_log is not None else None,
    }  # fmt: skip
    if code is not None and code > 0:
        return InvalidModelError(
            f"{name} could not be loaded: the runner {ended} while loading on backend "
            f"{backend}; llama.cpp's last lines: {said}",
            hint="the file may be corrupt or unsupported; see the runner log",
            details=details,
        )
    if code == -signal.SIGABRT and any("GGML_ASSERT" in line or "error" in line.lower()
                                       for line in lines):  # fmt: skip
        return InvalidModelError(
            f"llama.cpp aborted while loading {name} on backend {backend}: {said}",
            hint="the file may be corrupt or not supported by this llama.cpp; re-download it, "
            "or check 'modeld show'",
            details=details,
        )
    hint = "see the runner log" + (f" and {load_log}" if load_log is not None else "")
    if backend != "CPU":
        hint = (f"llama.cpp crashed on {backend}: try the model on the CPU (--gpu-layers 0), "
                f"and {hint}")  # fmt: skip
    return RunnerCrashedError(
        f"the runner crashed while loading {name} on backend {backend}: it {ended}; "
        f"llama.cpp's last lines: {said}",
        hint=hint,
        details=details,
    )

"""Helpers shared by the daemon integration tests (tests/test_daemon_*.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def until(
    fn: Callable[[], T],
    timeout: float = 15.0,
    what: str = "condition",
    show: Callable[[], object] | None = None,
) -> T:
    """Poll ``fn`` until it returns something truthy; fail with ``what`` after ``timeout``
    (and with ``show()``, e.g. the daemon's ``ps``, to explain the failure)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{show()!r}" if show is not None else ""
            raise AssertionError(f"timed out waiting for {what}; last value {value!r}{extra}")
        time.sleep(0.02)


def rows(client: Any) -> dict[str, dict[str, Any]]:
    """``ps`` rows by file name (``#embed``/``#rerank`` for those modes), leaving out
    unloading entries."""
    out: dict[str, dict[str, Any]] = {}
    for row in client.ps():
        if row["state"] == "unloading":
            continue
        suffix = "" if row["mode"] == "generate" else "#" + row["mode"]
        name = row["path"].rsplit("/", 1)[-1] + suffix
        if row["state"] == "waiting" and name in out:
            continue  # requests waiting for a loaded (draining) model: keep the entry's row
        out[name] = row
    return out


def loaded_names(client: Any) -> set[str]:
    """Names of the models that are loading or ready (not unloading or waiting)."""
    return {n for n, r in rows(client).items() if r["state"] in ("ready", "loading")}


def children(pid: int) -> set[int]:
    """The child processes of ``pid`` (every thread's, from /proc)."""
    out: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                out.update(int(x) for x in fh.read().split())
        except OSError:
            pass
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (exited, not yet reaped) does not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

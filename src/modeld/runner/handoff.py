"""Evaluated prompts carried across a reload with a larger context (issue 36).

When a prompt outgrows its model's context the daemon reloads the model with a larger one, and
the turn that caused it used to evaluate its whole prompt again (an agent's 20k tokens: about a
minute on 2 cores, at every growth). Now, before the old runner lets the model go, it writes
each sequence's cells and tokens (``llama_state_seq_save_file``), its prompt snapshots
(:mod:`.promptcache`, in :mod:`.promptfile`'s format) and then a manifest; the new runner, told
the same file prefix in its ``load``, waits for the manifest, restores each sequence into the
same sequence of its larger context (``llama_state_seq_load_file``), adds the snapshots to its
store and deletes the files, so the request that grew the context evaluates only what is new.
The snapshots matter where the live cells cannot be cut back to the new prompt: a
sliding-window model whose previous reply does not re-tokenize as it was decoded keeps only the
window's last cells, so only the snapshot of the previous prompt still gives its prefix. Restored
cells give bitwise the logits of a fresh evaluation (a 512-token prompt moved from a 1024 to a
4096 context, then 188 tokens more: gemma-3-270m and a Q8_0 llama, every logit equal).

Disk, not the daemon's socket: the states are large (~18 KiB a token for gemma-3-270m) and the
two runners may run at once. Pure file handling here; the states are written and read by
:class:`modeld.runner.generation.PromptState`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("modeld.runner.handoff")

#: The longest a new runner waits for the old one's manifest (writing a large state takes a
#: few seconds; a runner that died before writing it ends the wait at once).
WAIT_S = 30.0
#: Files of a handoff nobody took over (a load that failed) are removed after this long.
STALE_S = 3600.0

Entry = dict[str, Any]  # {"seq": int, "file": str, "tokens": int, "stable": int}


def seq_file(prefix: str, seq: int) -> str:
    return f"{prefix}.{seq}.seq"


def snapshots_file(prefix: str) -> str:
    """The runner's prompt snapshots (one store for all its sequences), written before the
    manifest; absent when it had none."""
    return f"{prefix}.snaps"


def manifest(prefix: str) -> Path:
    return Path(f"{prefix}.json")


def write_manifest(prefix: str, entries: list[Entry]) -> None:
    """The manifest, written last and atomically: its presence says the states are whole."""
    path = manifest(prefix)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the user's prompts
    with os.fdopen(fd, "w") as f:
        json.dump({"sequences": entries}, f)
    os.replace(tmp, path)


def wait_manifest(prefix: str, writer_alive: Callable[[], bool],
                  wait_s: float = WAIT_S) -> list[Entry]:
    """The entries of ``prefix``'s manifest once it is there; [] when the writer is gone
    without writing it, or after ``wait_s``, or when it cannot be read."""
    path = manifest(prefix)
    deadline = time.monotonic() + wait_s
    while not path.exists():
        if (time.monotonic() > deadline or not writer_alive()) and not path.exists():
            log.warning("handoff: no manifest at %s; evaluating prompts again", path)
            return []
        time.sleep(0.02)
    try:
        entries = json.loads(path.read_text())["sequences"]
        return [e for e in entries if isinstance(e, dict)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("handoff: ignoring %s: %s", path, exc)
        return []


def remove(prefix: str, entries: list[Entry]) -> None:
    for entry in entries:
        with contextlib.suppress(OSError, KeyError, TypeError):
            os.unlink(str(entry["file"]))
    for path in (Path(snapshots_file(prefix)), manifest(prefix)):
        with contextlib.suppress(OSError):
            path.unlink()


def prune_stale(directory: Path, now: float | None = None) -> None:
    """Remove handoff files older than :data:`STALE_S` (a reload whose load failed)."""
    now = time.time() if now is None else now
    with contextlib.suppress(OSError):
        for path in directory.glob("handoff-*"):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > STALE_S:
                    path.unlink()


def pid_alive(pid: int | None) -> Callable[[], bool]:
    """Whether process ``pid`` still runs (None: assume so, until the wait ends)."""

    def alive() -> bool:
        if pid is None:
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _zombie(pid)

    return alive


def _zombie(pid: int) -> bool:
    """An exited child not reaped yet still answers ``kill(pid, 0)``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False

"""Prompt snapshots that outlive a model's eviction: one file per model, on disk, not in RAM.

When a model is evicted its runner writes the prompt-state snapshots (:mod:`.promptcache`)
to ``<prompt cache dir>/<identity hash>.bin``; when the same model is loaded again, in whichever
runner, they are read back, so a switch back to a model does not evaluate its prompts again.
Disk, because memory given back on eviction must really be free; the directory is bounded
(oldest files removed first). A file is used only when its identity (model file, size, mtime,
context and batch sizes, llama-cpp-python version) matches; anything unreadable is ignored.

Format: ``MAGIC``, one JSON line (identity and per-snapshot sizes), then the raw buffers.
Pure: no llama_cpp (buffers are ctypes arrays made by the caller's factory).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from modeld.runner.promptcache import Snapshot

log = logging.getLogger("modeld.runner.promptfile")

MAGIC = b"MODELD-PROMPTS-1\n"
#: The directory keeps at most this many times one runner's cache budget ...
DIR_BUDGET_FACTOR = 8
#: ... and at most this much in all (the automatic budget reaches 4 GiB), unless one file
#: alone is larger.
DIR_MAX_BYTES = 4 << 30

Identity = dict[str, Any]
#: (raw bytes) -> a ctypes buffer holding them, for the state and the logits row respectively
BufferFactory = Callable[[bytes], Any]


def file_for(directory: Path, identity: Identity) -> Path:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
    return directory / f"{digest}.bin"


def save(directory: Path, identity: Identity, snapshots: Iterable[Snapshot],
         budget_bytes: int) -> int:
    """Write ``snapshots`` (most recently used last) for ``identity``; returns bytes written
    (0 when there was nothing to write or the write failed: a lost cache is not an error)."""
    snaps = list(snapshots)
    path = file_for(directory, identity)
    if not snaps:
        with contextlib.suppress(OSError):
            path.unlink()
        return 0
    written = write(path, identity, snaps)
    if written:
        limit = min(DIR_BUDGET_FACTOR * max(budget_bytes, written), max(DIR_MAX_BYTES, written))
        prune(directory, limit, keep=path)
    return written


def write(path: Path, identity: Identity, snaps: list[Snapshot]) -> int:
    """Write ``snaps`` to ``path`` (atomically, for the user only); the bytes written (0: the
    write failed)."""
    meta = {
        "identity": identity,
        "snapshots": [
            {"tokens": list(s.tokens), "state_size": s.state_size, "logits_size": s.logits_size,
             "stable": s.stable, "logits_stable": s.logits_stable, "cut_min": s.cut_min}
            for s in snaps
        ],
    }
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # 0600: the token lists are the user's prompts
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC)
            f.write(json.dumps(meta, separators=(",", ":")).encode() + b"\n")
            for s in snaps:
                f.write(memoryview(s.state).cast("B")[: s.state_size])
                f.write(memoryview(s.logits).cast("B")[: s.logits_size])
        os.replace(tmp, path)
        return path.stat().st_size
    except OSError as exc:
        log.warning("prompt cache: could not write %s: %s", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return 0


def touch(directory: Path, identity: Identity) -> bool:
    """Mark the file of ``identity`` as just written (its content is current); False when
    there is none."""
    try:
        os.utime(file_for(directory, identity))
    except OSError:
        return False
    return True


def load(directory: Path, identity: Identity, make_state: BufferFactory,
         make_logits: BufferFactory) -> list[Snapshot]:
    """The snapshots saved for ``identity`` (oldest first), or [] when there are none or the
    file does not match or is damaged."""
    return read(file_for(directory, identity), identity, make_state, make_logits)


def read(path: Path, identity: Identity, make_state: BufferFactory,
         make_logits: BufferFactory) -> list[Snapshot]:
    """The snapshots :func:`write` put in ``path`` for ``identity`` (oldest first); [] when
    there are none (a damaged or mismatched file is removed)."""
    try:
        data = path.read_bytes()
    except OSError:
        return []
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not a modeld prompt file")
        end = data.index(b"\n", len(MAGIC))
        meta = json.loads(data[len(MAGIC):end])
        if meta.get("identity") != identity:
            raise ValueError("written for another model or context")
        out, pos = [], end + 1
        for m in meta["snapshots"]:
            ss, ls = int(m["state_size"]), int(m["logits_size"])
            if pos + ss + ls > len(data):
                raise ValueError("truncated")
            state = make_state(data[pos:pos + ss])
            logits = make_logits(data[pos + ss:pos + ss + ls])
            pos += ss + ls
            out.append(Snapshot(tuple(int(t) for t in m["tokens"]), state, ss, logits, ls,
                                int(m["stable"]), bool(m["logits_stable"]),
                                int(m.get("cut_min", 0))))
        return out
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("prompt cache: ignoring %s: %s", path, exc)
        with contextlib.suppress(OSError):
            path.unlink()
        return []


def prune(directory: Path, max_bytes: int, keep: Path | None = None) -> None:
    """Remove the least recently written files until the directory holds ``max_bytes``."""
    try:
        files = [(p.stat().st_mtime, p.stat().st_size, p) for p in directory.glob("*.bin")]
    except OSError:
        return
    total = sum(size for _, size, _ in files)
    for _, size, p in sorted(files, key=lambda f: f[0]):
        if total <= max_bytes:
            break
        if p == keep:
            continue
        with contextlib.suppress(OSError):
            p.unlink()
            total -= size

"""Where pulled models live and what is known about them.

Layout (the LM Studio one the registry already scans): ``<models dir>/ORG/REPO/<file>.gguf``,
all shards of a split model side by side. Next to each file a hidden record
``.<file>.pull.json`` keeps where it came from and its SHA-256 (for ``/api/tags`` digests and
for a repeated pull that needs no download). Downloads in progress live in
``<models dir>/.partial/`` — hidden, so ``list``/``run`` never see a partial file.

Every path a pull writes or deletes is checked with :func:`contained` first (resolved, then
compared with the resolved models dir; no symbolic link where modeld writes its own file).
What pulls leave behind in ``.partial/`` is swept at the start of each pull
(:func:`sweep_partials`): lock files no pull holds, and partial downloads no pull has touched
for ``partial_max_age_s`` (7 days by default: long enough to resume a pull stopped on Friday).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from modeld.errors import InvalidRequestError
from modeld.pull.names import BadReference, HubRef, choose, is_model_file, shard_info

PARTIAL_DIR = ".partial"
RECORD_SUFFIX = ".pull.json"
#: Default of the ``partial_max_age_s`` setting: a partial download untouched this long is
#: abandoned and deleted by the next pull.
PARTIAL_MAX_AGE_S = 7 * 24 * 3600.0


def contained(models_dir: Path, path: Path) -> Path:
    """``path``, once proven to stay inside ``models_dir`` (every link on the way resolved)
    and not to be a symbolic link itself; else an error naming it: modeld writes and deletes
    only its own files there."""
    root = models_dir.resolve()
    real = path.resolve()
    if real != root and root not in real.parents:
        raise _escapes(path, f"resolves to {real}, outside the models dir {root}")
    if path.is_symlink():
        raise _escapes(path, "is a symbolic link where modeld keeps its own file")
    return path


def _escapes(path: Path, why: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"refusing to write {path}: it {why}",
        hint="remove that link (modeld follows none in the models dir), or point "
        "MODELD_MODELS at a directory that holds the models themselves",
        details={"path": str(path)},
    )


def nofollow(path: str, flags: int) -> int:
    """An ``opener`` for :func:`open` that never follows a link at the last component."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)


@contextlib.contextmanager
def free_lock(lock_path: Path) -> Iterator[bool]:
    """Whether no pull holds ``lock_path`` (taken without waiting; deleted when free, so a
    pull that opened it before finds its inode gone and opens it again)."""
    try:
        f = open(lock_path, "a+b", opener=nofollow)  # noqa: SIM115 (closed below)
    except OSError:
        yield False
        return
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            lock_path.unlink(missing_ok=True)


def sweep_partials(models_dir: Path, max_age_s: float = PARTIAL_MAX_AGE_S,
                   now: float | None = None) -> list[Path]:
    """Delete from ``.partial/`` what no pull is using: lock files nobody holds, partial
    downloads older than ``max_age_s`` (by modification time) whose lock is free, and links
    (modeld makes none). Returns what was deleted."""
    folder = partial_dir(models_dir)
    if folder.is_symlink() or not folder.is_dir():
        return []
    now = time.time() if now is None else now
    removed: list[Path] = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
        elif not entry.is_file(follow_symlinks=False):
            continue
        elif entry.name.endswith(".part"):
            try:
                age = now - entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            if age > max_age_s:
                with free_lock(path.with_suffix(".lock")) as free:
                    if free:
                        path.unlink(missing_ok=True)
                        removed.append(path)
        elif entry.name.endswith(".lock") and path.exists():
            with free_lock(path) as free:
                if free:
                    removed.append(path)
    return removed


def repo_dir(models_dir: Path, repo_id: str) -> Path:
    """``models_dir/ORG/REPO``; an existing directory that differs only in case is reused."""
    path = models_dir
    for part in repo_id.split("/"):
        exact = path / part
        if not exact.is_dir() and path.is_dir():
            same = [p for p in path.iterdir() if p.is_dir() and p.name.lower() == part.lower()]
            exact = same[0] if same else exact
        path = exact
    return path


def partial_dir(models_dir: Path) -> Path:
    return models_dir / PARTIAL_DIR


def target_path(models_dir: Path, repo_id: str, repo_path: str) -> Path:
    """Where a repository file lands: flat in the repo's directory (shards side by side)."""
    return repo_dir(models_dir, repo_id) / repo_path.rsplit("/", 1)[-1]


def record_path(model_file: Path) -> Path:
    return model_file.with_name(f".{model_file.name}{RECORD_SUFFIX}")


def write_record(model_file: Path, record: dict[str, Any]) -> None:
    """Write the file's record atomically (a reader sees the old one or the new one)."""
    path = record_path(model_file)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"schema_version": 1, **record, "pulled_at": time.time()},
                              indent=1) + "\n")  # fmt: skip
    os.replace(tmp, path)


def read_record(model_file: Path) -> dict[str, Any] | None:
    """The record of a pulled file; None for files put there by hand (or a broken record)."""
    try:
        data = json.loads(record_path(model_file).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def find_local(ref: HubRef, models_dir: Path) -> Path | None:
    """The pulled file ``ref`` names (first shard of a split model), if it is all here."""
    folder = repo_dir(models_dir, ref.repo_id)
    if not folder.is_dir():
        return None
    names = sorted(p.name for p in folder.glob("*.gguf") if p.is_file())
    if ref.filename is not None:
        base = ref.filename.rsplit("/", 1)[-1]
        ref = HubRef(ref.repo_id, filename=base)
    try:
        chosen = choose(ref, names)
    except KeyError:
        return None
    return folder / chosen.files[0]


def tag_of(path: str, name: str) -> tuple[str, str | None]:
    """``/api/tags``' name and digest: a pulled model is listed by its hub name
    (``hf.co/ORG/REPO:QUANT``) with the hex SHA-256 the hub published; others as they are."""
    record = read_record(Path(path))
    if not record or not isinstance(record.get("model"), str):
        return name, None
    digest = record.get("digest")
    hexdigest = digest.split(":", 1)[1] if isinstance(digest, str) and ":" in digest else None
    return record["model"], hexdigest


def local_model(text: str, models_dir: Path) -> Path | None:
    """For the registry: a strict hub name (``hf.co/…``, ``ORG/REPO:QUANT``) → its pulled file,
    else None (also for text that is no hub name)."""
    from modeld.pull.names import parse

    try:
        ref = parse(text, strict=True)
    except BadReference:
        return None
    return find_local(ref, models_dir)


def files_of(model_file: Path) -> list[Path]:
    """The model file and, for the first shard of a split model, its other shards."""
    info = shard_info(model_file.name)
    if info is None:
        return [model_file]
    stem = model_file.name[: -len(f"-{info[0]:05d}-of-{info[1]:05d}.gguf")]
    return [model_file.with_name(f"{stem}-{i:05d}-of-{info[1]:05d}.gguf")
            for i in range(1, info[1] + 1)]  # fmt: skip


def remove(model_file: Path, models_dir: Path) -> list[Path]:
    """Delete a model (all shards, their records) and, once no model is left in its folder,
    the image projector pulled with it; empty ORG/REPO folders go too. Returns the files
    deleted."""
    folder = model_file.parent
    contained(models_dir, folder)  # every shard, projector and record lives there
    doomed = files_of(model_file)
    if not any(is_model_file(p.name) and p not in doomed for p in folder.glob("*.gguf")):
        doomed += [p for p in sorted(folder.glob("*.gguf"))
                   if (read_record(p) or {}).get("role") == "mmproj"]  # fmt: skip
    removed = []
    for path in doomed:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
        with contextlib.suppress(FileNotFoundError):
            record_path(path).unlink()
    prune_empty(folder, models_dir)
    return removed


def prune_empty(folder: Path, models_dir: Path) -> None:
    """Remove ``folder`` and its parents while they are empty, up to the models dir."""
    top = models_dir.resolve()
    while folder.resolve() != top and top in folder.resolve().parents:
        try:
            folder.rmdir()  # only when empty
        except OSError:
            break
        folder = folder.parent

"""Where pulled models live and what is known about them.

Layout (the LM Studio one the registry already scans): ``<models dir>/ORG/REPO/<file>.gguf``,
all shards of a split model side by side. Next to each file a hidden record
``.<file>.pull.json`` keeps where it came from and its SHA-256 (for ``/api/tags`` digests and
for a repeated pull that needs no download). Downloads in progress live in
``<models dir>/.partial/`` — hidden, so ``list``/``run`` never see a partial file.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modeld.pull.names import BadReference, HubRef, choose, shard_info

if TYPE_CHECKING:
    pass

PARTIAL_DIR = ".partial"
RECORD_SUFFIX = ".pull.json"


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
    """Delete a model (all shards, their records); empty ORG/REPO folders go too. Returns
    the files deleted."""
    removed = []
    for path in files_of(model_file):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
        with contextlib.suppress(FileNotFoundError):
            record_path(path).unlink()
    parent = model_file.parent
    top = models_dir.resolve()
    while parent.resolve() != top and top in parent.resolve().parents:
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break
        parent = parent.parent
    return removed

"""A whole pull: name → listing → choice of files → disk check → each file fetched → result.

The files are the model's (every shard) and, when the repository has one, its image projector
(``mmproj``, as Ollama and LM Studio pull it), fetched last the same way: verified, resumable,
in the repository's folder beside the model, where the projector is found at load.

It reports what happens as plain dict events (the CLI renders them as a progress bar, JSON
lines or nothing; ``/api/pull`` as Ollama's NDJSON), so one implementation serves both.
Event kinds: ``manifest``, ``chosen``, ``progress`` (``phase``: waiting, resuming,
downloading, verifying), ``file_done``, ``success``.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modeld.errors import (
    DiskFullError,
    InvalidRequestError,
    ModelNotFoundError,
    format_bytes,
    unusable_path,
)
from modeld.pull import hub, listing, names, store
from modeld.pull.download import Transfer, fetch

EventFn = Callable[[dict[str, Any]], None]
#: Free space left over after a pull, so the disk is not filled to the last byte.
HEADROOM_BYTES = 1 << 20


def parse_ref(text: str) -> names.HubRef:
    """``modeld pull``'s argument → a hub reference (usage error with the accepted forms)."""
    try:
        return names.parse(text, strict=False)
    except names.BadReference as exc:
        raise InvalidRequestError(
            str(exc),
            hint="name a Hugging Face model: hf.co/ORG/REPO[:QUANT], ORG/REPO:QUANT or "
            "ORG/REPO/FILE.gguf (e.g. hf.co/unsloth/gemma-3-270m-it-GGUF:Q4_K_M)",
        ) from None


def pull(text: str, models_dir: Path, on_event: EventFn | None = None,
         cancel: threading.Event | None = None,
         partial_max_age_s: float = store.PARTIAL_MAX_AGE_S) -> dict[str, Any]:
    """Pull the model ``text`` names into ``models_dir``; returns the ``success`` event's data
    (``path`` of the model file, first shard for a split model). What earlier pulls abandoned
    in ``.partial/`` is swept first (:func:`store.sweep_partials`)."""
    try:
        return _pull(text, models_dir, on_event, cancel, partial_max_age_s)
    except OSError as exc:  # the models dir itself is unusable (permissions, a file there)
        raise unusable_path(exc, "MODELD_MODELS") from exc


def _pull(text: str, models_dir: Path, on_event: EventFn | None,
          cancel: threading.Event | None, partial_max_age_s: float) -> dict[str, Any]:
    emit = on_event or (lambda event: None)
    ref = parse_ref(text)
    hub.check_online(ref.name)
    store.sweep_partials(models_dir, partial_max_age_s)
    emit({"event": "manifest", "model": ref.name, "repo": ref.repo_id,
          "endpoint": hub.endpoint()})  # fmt: skip
    listed = hub.list_files(ref.repo_id, ref.revision)
    by_path = {f.path: f for f in listed}
    try:
        choice = names.choose(ref, list(by_path))
    except KeyError as exc:
        raise ModelNotFoundError(
            f"{exc.args[0]}",
            hint=f"see the files at {hub.endpoint()}/{ref.repo_id}/tree/{ref.revision}; name "
            "a quantisation that is there (ORG/REPO:QUANT) or one file (ORG/REPO/FILE.gguf)",
            details={"repo": ref.repo_id, "asked": ref.quant or ref.filename},
        ) from None
    paths = [*choice.files, *([choice.projector] if choice.projector else [])]
    files = [listing.checked(by_path[p], ref.repo_id) for p in paths]
    canonical = _canonical(ref, choice)
    transfers = [_transfer(ref, f, models_dir, canonical, choice.quant, _linked(choice, f.path))
                 for f in files]  # fmt: skip
    emit({"event": "chosen", "model": canonical, "quant": choice.quant, "reason": choice.reason,
          "message": _choice_message(ref, choice),
          "total": sum(f.size for f in files),
          "files": [{"file": t.target.name, "size": t.size, "digest": t.digest}
                    for t in transfers]})  # fmt: skip
    _check_disk(transfers, models_dir)
    results = []
    for t in transfers:
        def progress(phase: str, done: int, total: int, t: Transfer = t) -> None:
            emit({"event": "progress", "file": t.target.name, "digest": t.digest,
                  "phase": phase, "completed": done, "total": total})  # fmt: skip

        r = fetch(t, progress, cancel)
        results.append(r)
        emit({"event": "file_done", "file": t.target.name, "digest": t.digest,
              "path": str(r.target), "size": t.size, "fetched_bytes": r.fetched_bytes,
              "resumed_from": r.resumed_from, "shared": r.shared,
              "present": r.present})  # fmt: skip
    done = {"model": canonical, "path": str(results[0].target), "quant": choice.quant,
            "files": [str(r.target) for r in results],
            "size": sum(t.size for t in transfers),
            "fetched_bytes": sum(r.fetched_bytes for r in results),
            "digest": transfers[0].digest,
            "mmproj": str(results[-1].target) if choice.projector else None}  # fmt: skip
    emit({"event": "success", **done})
    return done


def _canonical(ref: names.HubRef, choice: names.FileChoice) -> str:
    if ref.filename is not None or choice.quant is None:
        return f"hf.co/{ref.repo_id}/{choice.files[0]}"
    return f"hf.co/{ref.repo_id}:{choice.quant}"


def _linked(choice: names.FileChoice, path: str) -> dict[str, str]:
    """What a file's record says of the model–projector pair: the model's names its projector
    (so projector.beside finds it among several pulled quantisations), the projector's says
    it is one."""
    if choice.projector is None:
        return {}
    if path == choice.projector:
        return {"role": "mmproj"}
    return {"mmproj": choice.projector.rsplit("/", 1)[-1]} if path == choice.files[0] else {}


def _choice_message(ref: names.HubRef, choice: names.FileChoice) -> str:
    shards = f" in {len(choice.files)} shards" if len(choice.files) > 1 else ""
    if choice.projector:
        shards += f", with its image projector {choice.projector.rsplit('/', 1)[-1]}"
    if choice.reason == "fallback":
        return (f"{ref.repo_id} has no {names.DEFAULT_QUANT}; taking {choice.quant or '?'}, the "
                f"best one listed{shards}")
    return f"{ref.repo_id}: {choice.files[0]}{shards}"


def _transfer(ref: names.HubRef, f: hub.RemoteFile, models_dir: Path, canonical: str,
              quant: str | None, extra: dict[str, str]) -> Transfer:
    """``extra`` in the record: the model's names its image projector (``mmproj``, found by
    projector.beside), the projector's says it is one (``role``)."""
    return Transfer(
        url=hub.file_url(ref.repo_id, f.path, ref.revision),
        size=f.size, sha256=f.sha256, git_oid=f.git_oid,
        target=store.target_path(models_dir, ref.repo_id, f.path),
        models_dir=models_dir, repo_id=ref.repo_id,
        headers=hub.auth_headers(),
        record={"model": canonical, "repo": ref.repo_id, "revision": ref.revision,
                "repo_path": f.path, "quant": quant, **extra},
    )  # fmt: skip


def _check_disk(transfers: list[Transfer], models_dir: Path) -> None:
    """Refuse before the first byte when the rest of the download cannot fit."""
    need = 0
    for t in transfers:
        if t.target.is_file() and t.target.stat().st_size == t.size:
            continue
        part = t.partial
        have = part.stat().st_size if part.is_file() else 0
        need += max(t.size - have, 0)
    if not need:
        return
    models_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(models_dir).free
    if need + HEADROOM_BYTES > free:
        raise DiskFullError(
            f"not enough free disk in {models_dir}: the pull needs {format_bytes(need)}, "
            f"{format_bytes(free)} is free",
            hint="free some space (modeld rm NAME removes a model) or point MODELD_MODELS at "
            "a bigger disk",
            details={"need_bytes": need, "free_bytes": free, "models_dir": str(models_dir)},
        )

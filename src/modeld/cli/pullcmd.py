"""``modeld pull``, ``modeld rm``, and the pull that ``run``/``load`` do for a hub name that
is not here yet (as ``ollama run`` does). The pull itself is :mod:`modeld.pull.puller`; this
module only renders its events: a rich progress bar on a terminal (bytes, rate, ETA, one bar
per shard), one JSON line per event with ``--json``, only the final path with ``--quiet``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modeld.cli import render
from modeld.errors import CancelledError, InvalidRequestError

if TYPE_CHECKING:
    from modeld.client import Client
    from modeld.config import Settings

EventFn = Callable[[dict[str, Any]], None]


def pull_command(settings: Settings, ref: str, *, json_out: bool, quiet: bool) -> None:
    """Pull ``ref``; stdout gets JSON lines (``--json``), the path (``--quiet``) or a summary."""
    if json_out:
        done = _pull(settings, ref, _json_lines)
        return
    if quiet:
        done = _pull(settings, ref, lambda event: None)
        sys.stdout.write(done["path"] + "\n")
        return
    with _Bars() as bars:
        done = _pull(settings, ref, bars.event)
    sys.stdout.write(f"pulled {done['model']} ({_size(done['size'])}): {done['path']}\n")
    if done["mmproj"]:
        sys.stdout.write(f"with its image projector: {done['mmproj']}\n")


def ensure_pulled(settings: Settings, model: str | None, *, no_pull: bool) -> None:
    """Before ``run``/``load``: a hub name (``hf.co/…``, ``ORG/REPO:QUANT``) that is not in the
    models dir is pulled first, progress on stderr. ``--no-pull``/``MODELD_NO_PULL`` leave it
    to the daemon, which then answers model-not-found with the ``modeld pull`` hint."""
    from modeld.registry import is_hub_name

    if not model or not is_hub_name(model.strip()):
        return
    from modeld.pull.store import local_model

    if local_model(model.strip(), Path(settings.models_dir).expanduser()) is not None:
        return
    if no_pull or os.environ.get("MODELD_NO_PULL", "").lower() in ("1", "true", "yes"):
        return
    render.message(f"modeld: {model} is not here yet: pulling it")
    if sys.stderr.isatty():
        with _Bars() as bars:
            _pull(settings, model.strip(), bars.event)
    else:
        _pull(settings, model.strip(), _plain_lines)


def _pull(settings: Settings, ref: str, on_event: EventFn) -> dict[str, Any]:
    """The pull; Ctrl-C or SIGTERM stop it as a cancellation (its lock file goes, the partial
    download stays for the next pull to resume)."""
    import signal

    from modeld.pull.puller import pull

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        return pull(ref, Path(settings.models_dir).expanduser(), on_event,
                    partial_max_age_s=settings.partial_max_age_s)  # fmt: skip
    except KeyboardInterrupt:
        raise CancelledError(f"pull of {ref} interrupted",
                             hint="pull again: it resumes where it stopped") from None
    finally:
        signal.signal(signal.SIGTERM, old)


def _json_lines(event: dict[str, Any]) -> None:
    import json

    doc = {"schema_version": render.JSON_SCHEMA_VERSION, "kind": "pull", **event}
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _plain_lines(event: dict[str, Any]) -> None:
    """Progress for a log file or a pipe: what was chosen and each file done."""
    if event["event"] == "chosen":
        render.message(f"modeld: {event['message']} ({_size(event['total'])})")
    elif event["event"] == "file_done":
        how = "already here" if event["present"] else "verified"
        render.message(f"modeld: {event['file']}: {how} ({event['digest'][:19]}…)")


def _size(n: int) -> str:
    from modeld.errors import format_bytes

    return format_bytes(n)


class _Bars:
    """rich progress bars on stderr, one per file; messages between them."""

    def __enter__(self) -> _Bars:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), console=render.console(stderr=True),
            transient=False,
        )  # fmt: skip
        self.tasks: dict[str, Any] = {}
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def event(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "chosen":
            self.progress.console.print(f"{event['message']} ({_size(event['total'])})")
            for f in event["files"]:
                self.tasks[f["file"]] = self.progress.add_task(f["file"], total=f["size"])
        elif kind == "progress":
            task = self.tasks.get(event["file"])
            if task is not None:
                label = {"waiting": "waiting for another pull: ", "resuming": "resuming ",
                         "verifying": "verifying "}.get(event["phase"], "")  # fmt: skip
                self.progress.update(task, completed=event["completed"],
                                     description=label + event["file"])
        elif kind == "file_done":
            task = self.tasks.get(event["file"])
            if task is not None:
                self.progress.update(task, completed=event["size"], description=event["file"])


# ---------------------------------------------------------------------- rm


def rm_command(settings: Settings, name: str, *, force: bool, json_out: bool,
               connect: Callable[[], Client]) -> None:
    """Delete a model from the models dir; a loaded one only with ``force`` (unloaded first)."""
    from modeld import registry
    from modeld.errors import DaemonUnavailableError
    from modeld.pull import store

    path = registry.removable(name, settings)
    loaded: list[str] = []
    try:
        client = connect()
        loaded = [str(r.get("name")) for r in client.ps()
                  if r.get("path") == str(path)]  # fmt: skip
    except DaemonUnavailableError:
        client = None  # no daemon: nothing is loaded
    if loaded and client is not None:
        if not force:
            raise InvalidRequestError(
                f"{name} is loaded ({', '.join(sorted(set(loaded)))})",
                hint=f"modeld rm --force {name} unloads it first (or modeld unload it)",
                details={"path": str(path)},
            )
        client.unload(str(path))
    removed = store.remove(path, Path(settings.models_dir).expanduser())
    data = {"model": name, "removed": [str(p) for p in removed], "unloaded": bool(loaded)}
    if json_out:
        render.emit_json("rm", data)
    else:
        render.message(f"deleted {name}: {len(removed)} file(s)"
                       + (" (unloaded first)" if loaded else ""))  # fmt: skip

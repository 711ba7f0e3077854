"""Hub model references and which GGUF files a quantisation means (pure: no I/O).

Accepted forms (what Ollama, llama-server ``-hf`` and LM Studio users type):
``hf.co/ORG/REPO[:QUANT]``, ``huggingface.co/ORG/REPO[:QUANT]``, ``ORG/REPO[:QUANT]``,
``ORG/REPO@QUANT``, ``https://huggingface.co/ORG/REPO[/resolve|blob/REV/PATH.gguf]`` and
``[hf.co/]ORG/REPO/PATH.gguf`` for one exact file. The quantisation tag is case-insensitive;
without one, Q4_K_M is taken (llama-server's default), else the best one listed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_QUANT = "Q4_K_M"
#: Preference when the asked (or default) quantisation is missing: llama.cpp's usual
#: quality/size sweet spots first, then bigger, then smaller, then unquantised.
QUANT_ORDER = (
    "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "IQ4_XS", "IQ4_NL", "Q4_0", "Q4_1", "Q6_K", "Q8_0",
    "Q5_0", "Q5_1", "Q3_K_L", "Q3_K_M", "Q3_K_S", "IQ3_M", "IQ3_S", "IQ3_XS", "IQ3_XXS",
    "Q2_K_L", "Q2_K", "IQ2_M", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S", "TQ2_0",
    "TQ1_0", "BF16", "F16", "F32",
)  # fmt: skip
_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "https://hf.co/",
             "http://hf.co/", "huggingface.co/", "hf.co/")  # fmt: skip
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO_RE = re.compile(rf"^({_PART})/({_PART})(?:[:@]([A-Za-z0-9._-]+))?$")
_FILE_RE = re.compile(rf"^({_PART})/({_PART})/(.+\.gguf)$", re.IGNORECASE)
_URL_FILE_RE = re.compile(rf"^({_PART})/({_PART})/(?:resolve|blob)/([^/]+)/(.+)$")
#: An image projector's precision when none has the model's quantisation: llama.cpp's
#: converters write F16 by default; BF16 and Q8_0 are near it, F32 is twice its size.
PROJECTOR_ORDER = ("F16", "BF16", "Q8_0", "F32")
_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_QUANT_IN_NAME = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|TQ\d_\d|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE
)


class BadReference(ValueError):
    """The text is not a hub model reference."""


@dataclass(frozen=True)
class HubRef:
    """A model on the hub: a repository, and a quantisation or one exact file in it."""

    repo_id: str  # ORG/REPO
    quant: str | None = None  # as typed (matched case-insensitively); None: default choice
    filename: str | None = None  # path in the repository, for the exact-file form
    revision: str = "main"

    @property
    def name(self) -> str:
        """The canonical name, ``hf.co/ORG/REPO:QUANT`` (or ``…/PATH.gguf``)."""
        if self.filename:
            return f"hf.co/{self.repo_id}/{self.filename}"
        return f"hf.co/{self.repo_id}" + (f":{self.quant}" if self.quant else "")


def has_hub_prefix(text: str) -> bool:
    """``hf.co/…``, ``huggingface.co/…`` or their URLs: a hub name, never a local path."""
    return text.strip().lower().startswith(_PREFIXES)


def parse(text: str, *, strict: bool = False) -> HubRef:
    """A reference → :class:`HubRef`; :class:`BadReference` when it is not one.

    ``strict`` (how ``run``/``load`` and the registry read a name) needs a hub prefix or a
    ``:QUANT`` tag, so ``org/model.gguf`` and ``dir/file`` stay local paths; ``modeld pull``
    reads everything as a hub reference.
    """
    raw = text.strip()
    prefixed = has_hub_prefix(raw)
    body = raw
    for prefix in _PREFIXES:
        if body.lower().startswith(prefix):
            body = body[len(prefix):]
            break
    body = body.rstrip("/")
    if prefixed and (m := _URL_FILE_RE.match(body)):
        org, repo, rev, path = m.groups()
        if not path.lower().endswith(".gguf"):
            raise BadReference(f"{text!r} names {path}, which is not a .gguf file")
        return HubRef(f"{org}/{repo}", filename=path, revision=rev)
    if m := _REPO_RE.match(body):
        org, repo, quant = m.groups()
        if repo.lower().endswith(".gguf") and not prefixed:
            raise BadReference(f"{text!r} reads as a file path, not ORG/REPO")
        if strict and not prefixed and quant is None:
            raise BadReference(f"{text!r} has no hf.co/ prefix and no :QUANT tag")
        if quant is not None and quant.lower() == "latest":
            quant = None  # Ollama clients add :latest to every name
        return HubRef(f"{org}/{repo}", quant=quant)
    if (m := _FILE_RE.match(body)) and (prefixed or not strict):
        org, repo, path = m.groups()
        return HubRef(f"{org}/{repo}", filename=path)
    raise BadReference(
        f"{text!r} is not a hub model reference (hf.co/ORG/REPO[:QUANT] or ORG/REPO:QUANT)"
    )


def parse_or_none(text: str | None, *, strict: bool = True) -> HubRef | None:
    """:func:`parse`, or None for anything else (local names and paths)."""
    if not text:
        return None
    try:
        return parse(text, strict=strict)
    except BadReference:
        return None


def quant_of(filename: str) -> str | None:
    """The quantisation tag in a GGUF file name (upper case), e.g. ``Q4_K_M``; None if none."""
    base = filename.rsplit("/", 1)[-1]
    found = _QUANT_IN_NAME.findall(_SHARD_RE.sub(".gguf", base))
    if not found:
        folder = filename.rsplit("/", 2)[-2] if "/" in filename else ""
        found = _QUANT_IN_NAME.findall(folder)
    return found[-1].upper() if found else None


def shard_info(filename: str) -> tuple[int, int] | None:
    """(index, total) for a split model's shard ``…-00002-of-00003.gguf``; None otherwise."""
    m = _SHARD_RE.search(filename)
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_projector_file(filename: str) -> bool:
    """An image projector (``mmproj``: "mmproj" in a GGUF's name, how Hugging Face repositories
    ship them); pulled with its model, never listed or run as a model itself."""
    base = filename.rsplit("/", 1)[-1].lower()
    return base.endswith(".gguf") and "mmproj" in base


def is_model_file(filename: str) -> bool:
    """A GGUF with weights to run: not an image projector."""
    return filename.lower().endswith(".gguf") and not is_projector_file(filename)


def model_base(filename: str) -> str:
    """A model file's name without its quantisation tag and what follows, lower case:
    ``gemma-3-4b-it-Q4_K_M.gguf`` → ``gemma-3-4b-it`` (to match its ``mmproj-gemma-3-4b-it``)."""
    base = filename.rsplit("/", 1)[-1].lower().removesuffix(".gguf")
    m = _QUANT_IN_NAME.search(base)
    return (base[: m.start()] if m else base).rstrip("-._")


def choose_projector(model: str, listed: list[str]) -> str | None:
    """The image projector a pull fetches with ``model`` (a repository path), or None.

    Among the ``mmproj`` GGUFs listed (those in the model's folder, if any): the ones whose
    name holds the model's base name (a repository of several models), then the one of the
    model's quantisation, else of :data:`PROJECTOR_ORDER`, else the first by name.
    """
    found = sorted(p for p in listed if is_projector_file(p))
    folder = model.rpartition("/")[0]
    found = [p for p in found if p.rpartition("/")[0] == folder] or found
    stem = model_base(model)
    found = [p for p in found if stem and stem in p.rsplit("/", 1)[-1].lower()] or found
    if not found:
        return None
    by_quant: dict[str | None, str] = {}
    for path in found:
        by_quant.setdefault(quant_of(path.rsplit("/", 1)[-1]), path)
    for quant in (quant_of(model), *PROJECTOR_ORDER):
        if quant is not None and quant in by_quant:
            return by_quant[quant]
    return found[0]


@dataclass(frozen=True)
class FileChoice:
    """The files a pull fetches, and how they were chosen."""

    files: tuple[str, ...]  # repository paths, shards in order
    quant: str | None  # the quantisation they hold
    reason: str  # "asked", "default", "fallback" (asked one missing: best listed), "file"
    projector: str | None = None  # the repository's image projector (mmproj) fetched with it


def choose(ref: HubRef, listed: list[str]) -> FileChoice:
    """Pick the files for ``ref`` among the repository's paths ``listed``: the model's and its
    image projector (:func:`choose_projector`), when the repository has one.

    KeyError (message: what is there) when the asked quantisation or file is missing; an
    asked quantisation never silently becomes another. Without one: Q4_K_M, else the first of
    :data:`QUANT_ORDER` present, else the first model file.
    """
    choice = _choose_model(ref, listed)
    head = choice.files[0]
    projector = choose_projector(head, listed) if is_model_file(head) else None
    return FileChoice(choice.files, choice.quant, choice.reason, projector)


def _choose_model(ref: HubRef, listed: list[str]) -> FileChoice:
    models = sorted(p for p in listed if is_model_file(p))
    if ref.filename is not None:
        if ref.filename not in listed:
            raise KeyError(f"{ref.repo_id} has no file {ref.filename}")
        return FileChoice(_with_shards(ref.filename, models), quant_of(ref.filename), "file")
    by_quant: dict[str, list[str]] = {}
    for path in models:
        info = shard_info(path)
        if info is None or info[0] == 1:
            by_quant.setdefault(quant_of(path) or "", []).append(path)
    if not by_quant:
        raise KeyError(f"{ref.repo_id} has no .gguf model files")
    if ref.quant is not None:
        heads = by_quant.get(ref.quant.upper())
        if not heads:
            have = ", ".join(sorted(q for q in by_quant if q)) or "none tagged"
            raise KeyError(f"{ref.repo_id} has no {ref.quant.upper()} file (it has: {have})")
        return FileChoice(_with_shards(heads[0], models), ref.quant.upper(), "asked")
    for quant in QUANT_ORDER:
        if quant in by_quant:
            reason = "default" if quant == DEFAULT_QUANT else "fallback"
            return FileChoice(_with_shards(by_quant[quant][0], models), quant, reason)
    first = sorted(by_quant.items())[0]
    return FileChoice(_with_shards(first[1][0], models), first[0] or None, "fallback")


def _with_shards(head: str, models: list[str]) -> tuple[str, ...]:
    """``head`` and, for a split model, all of its shards in order."""
    info = shard_info(head)
    if info is None:
        return (head,)
    stem = head[: _SHARD_RE.search(head).start()]  # type: ignore[union-attr]
    total = info[1]
    wanted = [f"{stem}-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1)]
    lower = {m.lower(): m for m in models}
    missing = [w for w in wanted if w.lower() not in lower]
    if missing:
        raise KeyError(f"split model {head} is missing shards: {', '.join(missing)}")
    return tuple(lower[w.lower()] for w in wanted)

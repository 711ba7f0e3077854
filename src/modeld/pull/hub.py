"""The hub's side of a pull, through huggingface_hub: list a repository's files with their
LFS SHA-256, build download URLs and auth headers, and turn its errors into modeld's.

huggingface_hub honours ``HF_ENDPOINT`` (a mirror, or the tests' loopback fake hub),
``HF_TOKEN`` (or a ``hf auth login`` token) and ``HF_HUB_OFFLINE``; modeld keeps all three.
It is imported only when a pull runs (its import costs ~150 ms).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from modeld.errors import (
    ModeldError,
    ModelNotFoundError,
    NetworkError,
    UnauthorizedError,
)

TOKEN_HINT = ("set HF_TOKEN to a Hugging Face access token (https://huggingface.co/settings/"
              "tokens) and, for a gated model, accept its terms on the model's page")  # fmt: skip


@dataclass(frozen=True)
class RemoteFile:
    """One file of a hub repository."""

    path: str
    size: int
    sha256: str | None  # LFS files (every GGUF on the hub); None for small git files
    git_oid: str  # the git blob id: sha1 of "blob <size>\0" + content


def endpoint() -> str:
    """The hub's base URL (``HF_ENDPOINT``, read now rather than at import)."""
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def check_online(name: str) -> None:
    if offline():
        raise NetworkError(
            f"cannot pull {name}: HF_HUB_OFFLINE is set",
            hint="unset HF_HUB_OFFLINE to download, or use a model that is already here "
            "(modeld list)",
            details={"model": name},
        )


def list_files(repo_id: str, revision: str) -> list[RemoteFile]:
    """Every file in the repository at ``revision`` (recursive), or a modeld error."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint())
    try:
        entries = list(api.list_repo_tree(repo_id, recursive=True, revision=revision))
    except Exception as exc:
        raise hub_error(exc, repo_id) from exc
    out = []
    for entry in entries:
        if isinstance(entry, RepoFile):
            sha = entry.lfs.sha256 if entry.lfs is not None else None
            out.append(RemoteFile(entry.path, int(entry.size), sha, entry.blob_id))
    return out


def file_url(repo_id: str, path: str, revision: str) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo_id, path, revision=revision, endpoint=endpoint())


def auth_headers() -> dict[str, str]:
    """User-Agent and, when a token is known, Authorization (never sent to a redirect)."""
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    from modeld import __version__

    return dict(build_hf_headers(library_name="modeld", library_version=__version__))


def hub_error(exc: BaseException, repo_id: str) -> ModeldError:
    """huggingface_hub's exceptions → modeld's, each with what to do next."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    details: dict[str, object] = {"repo": repo_id, "endpoint": endpoint()}
    if isinstance(exc, GatedRepoError):
        return UnauthorizedError(f"{repo_id} is gated: the hub refused access",
                                 hint=TOKEN_HINT, details=details)
    if isinstance(exc, RepositoryNotFoundError):
        auth = "with the token given" if _has_token() else "without a token"
        return ModelNotFoundError(
            f"no repository {repo_id} on {endpoint()} (or it is private: asked {auth})",
            hint=f"check the name (ORG/REPO as on the model's page); for a private model, "
            f"{TOKEN_HINT}", details=details)
    if isinstance(exc, RevisionNotFoundError):
        return ModelNotFoundError(f"{repo_id} has no such revision", hint="check the revision",
                                  details=details)
    if isinstance(exc, OfflineModeIsEnabled):
        return NetworkError(f"cannot list {repo_id}: offline mode is on",
                            hint="unset HF_HUB_OFFLINE", details=details)
    if isinstance(exc, HfHubHTTPError):
        status = _status(exc)
        details["status"] = status
        if status in (401, 403):
            return UnauthorizedError(f"the hub refused access to {repo_id} (HTTP {status})",
                                     hint=TOKEN_HINT, details=details)
        return NetworkError(f"the hub answered HTTP {status} for {repo_id}",
                            hint="try again later; check HF_ENDPOINT if you use a mirror",
                            details=details)
    return NetworkError(f"cannot reach the hub at {endpoint()}: {_short(exc)}",
                        hint="check the network connection (and HF_ENDPOINT, HTTPS_PROXY), "
                        "then pull again: it resumes", details=details)


def _status(exc: Any) -> int:
    response = getattr(exc, "response", None)
    return int(getattr(response, "status_code", 0) or 0)


def _has_token() -> bool:
    from huggingface_hub import get_token

    return get_token() is not None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

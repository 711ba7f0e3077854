"""What a hub's listing may say before modeld acts on it (pure: no I/O).

The listing comes from the network: a hostile hub or mirror (``HF_ENDPOINT``) chooses every
field. Its SHA-256 and git blob id name the partial download's file, its path names the model
file, its size says how much to fetch, so each is checked before anything is written: a
SHA-256 is 64 hex digits, a git blob id 40, a size at least a GGUF header, a file name one
plain component (no ``..``, no leading dot, no control characters such as NUL or a newline).
"""

from __future__ import annotations

import re

from modeld.errors import VerificationError
from modeld.pull.hub import RemoteFile

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_GIT_OID = re.compile(r"[0-9a-fA-F]{40}")
#: The smallest GGUF file: magic, version, tensor count and key-value count (4+4+8+8 bytes).
GGUF_HEADER_BYTES = 24
#: Longest file name most file systems take (bytes of UTF-8).
NAME_MAX = 255


def checked(f: RemoteFile, repo_id: str) -> RemoteFile:
    """``f`` with its hashes in lower case, or a :class:`VerificationError` naming the field
    the hub got wrong (nothing has been written yet)."""
    name = f.path.rsplit("/", 1)[-1]
    if problem := path_problem(f.path):
        raise _invalid(repo_id, f.path, problem)
    if f.sha256 is not None and not _SHA256.fullmatch(f.sha256):
        raise _invalid(repo_id, name, f"its SHA-256 {f.sha256[:80]!r} is not 64 hex digits")
    if not _GIT_OID.fullmatch(f.git_oid or ""):
        raise _invalid(repo_id, name, f"its git blob id {str(f.git_oid)[:80]!r} is not 40 hex "
                       "digits")  # fmt: skip
    if f.size < GGUF_HEADER_BYTES:
        raise _invalid(repo_id, name, f"its size is {f.size} bytes (a GGUF file has at least "
                       f"{GGUF_HEADER_BYTES})")  # fmt: skip
    sha = f.sha256.lower() if f.sha256 is not None else None
    return RemoteFile(f.path, f.size, sha, f.git_oid.lower())


def path_problem(path: str) -> str | None:
    """Why ``path`` (a file's path in the repository) cannot name a file here, or None."""
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "its name holds a control character (NUL, newline, ...)"
    if path.startswith("/") or "\\" in path:
        return "its path is absolute or holds a backslash"
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "its path has an empty, '.' or '..' component"
    name = parts[-1]
    if name.startswith("."):
        return "its name starts with a dot (hidden, where modeld keeps its records)"
    if len(name.encode()) > NAME_MAX:
        return f"its name is longer than {NAME_MAX} bytes"
    return None


def _invalid(repo_id: str, name: str, problem: str) -> VerificationError:
    return VerificationError(
        f"the hub's listing of {repo_id} is not valid: {name!r}: {problem}; nothing was "
        "downloaded or written",
        hint="the hub (or the mirror HF_ENDPOINT points at) sent a malformed listing: check "
        "HF_ENDPOINT, or pull another repository",
        details={"repo": repo_id, "file": name, "problem": problem},
    )

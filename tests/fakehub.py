"""A Hugging Face hub stand-in on loopback for pull tests and the pull benchmark.

It answers the requests huggingface_hub and modeld make (``HF_ENDPOINT=hub.url``):

- ``GET /api/models/ORG/REPO/tree/REV?recursive=…``: the file list, each GGUF with its LFS
  ``oid`` (sha256) and ``size``, and a git blob ``oid``;
- ``GET|HEAD /ORG/REPO/resolve/REV/PATH``: the bytes, with ``Range`` (206 + Content-Range),
  ``ETag``/``X-Linked-Etag``, ``X-Repo-Commit`` and no ``X-Xet-*`` headers (plain HTTP).

Faults per file (:class:`Fault`): drop the connection after N bytes (for the first K
requests), flip one byte (the published hashes stay those of the good file), a fixed status
(404, 401/403 gated), or a slow stream. Every request and every byte sent is counted, so a
test can say "bytes fetched in total ≤ 1.1 × the file". Loopback only; every loop is bounded
by the file's size.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SEND_CHUNK = 1 << 20


@dataclass
class Fault:
    drop_after: int | None = None  # close the connection after this many body bytes …
    drop_times: int = 1  # … for this many requests
    flip_byte_at: int | None = None  # serve this byte XOR 0xFF (hash headers unchanged)
    status: int | None = None  # answer every download with this status
    error_code: str | None = None  # X-Error-Code with it (GatedRepo, RepoNotFound, …)
    bytes_per_s: float | None = None  # throttle (a slow server)
    token: str | None = None  # gated: 401 GatedRepo unless "Authorization: Bearer <token>"
    ignore_range: bool = False  # answer 200 with the whole file even when asked for a range
    redirect: bool = False  # 302 to a "CDN" path that refuses an Authorization header (as the
    #                         hub's signed LFS URLs do)


@dataclass
class HubFile:
    data: bytes | None = None
    path: Path | None = None  # served from disk (large benchmark files)
    lfs: bool = True
    fault: Fault = field(default_factory=Fault)
    sha256: str = ""
    git_oid: str = ""
    size: int = 0
    listed: dict[str, Any] = field(default_factory=dict)  # a hostile hub: these fields of the
    #                      listing entry (and of its "lfs" object) replace the true ones

    def __post_init__(self) -> None:
        content = self.content()
        self.size = len(content)
        self.sha256 = hashlib.sha256(content).hexdigest()
        self.git_oid = hashlib.sha1(f"blob {self.size}\0".encode() + content).hexdigest()

    def content(self) -> Any:
        if self.data is not None:
            return self.data
        assert self.path is not None
        with open(self.path, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


@dataclass
class Repo:
    files: dict[str, HubFile] = field(default_factory=dict)
    tree_status: int | None = None  # e.g. 401 for a private repo
    tree_error_code: str | None = None


class FakeHub:
    """``with FakeHub() as hub: hub.add("org/repo", {"m-Q4_K_M.gguf": data}); hub.url``"""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.lock = threading.Lock()
        self.sent: dict[str, int] = {}  # "ORG/REPO/PATH" → body bytes sent
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self.auth_seen: list[str | None] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo_id: str, files: dict[str, bytes | Path | HubFile]) -> Repo:
        repo = self.repos.setdefault(repo_id, Repo())
        for name, value in files.items():
            if isinstance(value, HubFile):
                repo.files[name] = value
            elif isinstance(value, Path):
                repo.files[name] = HubFile(path=value)
            else:
                repo.files[name] = HubFile(data=value, lfs=name.endswith(".gguf"))
        return repo

    def file(self, repo_id: str, path: str) -> HubFile:
        return self.repos[repo_id].files[path]

    def sent_bytes(self, repo_id: str, path: str) -> int:
        with self.lock:
            return self.sent.get(f"{repo_id}/{path}", 0)

    def downloads(self, repo_id: str, path: str, cdn: bool = False) -> list[str | None]:
        """The Range header of each GET of the file (None: the whole file), at the hub's
        ``resolve`` URL or, with ``cdn``, at the URL a redirect points to."""
        org, repo = repo_id.split("/")
        start = f"/cdn/{org}/{repo}/" if cdn else f"/{org}/{repo}/resolve/"
        with self.lock:
            return [r for m, p, r in self.requests
                    if m == "GET" and p.startswith(start) and p.endswith("/" + path)]

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

        def _serve(self, head: bool) -> None:
            path = unquote(urlparse(self.path).path)
            with hub.lock:
                hub.requests.append((self.command, path, self.headers.get("Range")))
                hub.auth_seen.append(self.headers.get("Authorization"))
            parts = path.strip("/").split("/")
            if parts[0] == "cdn" and len(parts) >= 4:  # /cdn/ORG/REPO/PATH
                repo = hub.repos.get(f"{parts[1]}/{parts[2]}")
                name = "/".join(parts[3:])
                if repo is None or name not in repo.files:
                    return self._status(404, None)
                if self.headers.get("Authorization"):
                    return self._status(400, None, "Only one auth mechanism allowed")
                return self._file(f"{parts[1]}/{parts[2]}/{name}", repo.files[name], head,
                                  cdn=True)  # fmt: skip
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
                return self._tree(f"{parts[2]}/{parts[3]}")
            if len(parts) >= 5 and parts[2] == "resolve":
                repo = hub.repos.get(f"{parts[0]}/{parts[1]}")
                name = "/".join(parts[4:])
                if repo is None or name not in repo.files:
                    return self._status(404, "EntryNotFound" if repo else "RepoNotFound")
                return self._file(f"{parts[0]}/{parts[1]}/{name}", repo.files[name], head)
            self._status(404, None)

        def _status(self, code: int, error_code: str | None, message: str = "") -> None:
            body = json.dumps({"error": message or f"status {code}"}).encode()
            self.send_response(code)
            if error_code:
                self.send_header("X-Error-Code", error_code)
            if message:
                self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _tree(self, repo_id: str) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._status(404, "RepoNotFound", "Repository not found")
            if repo.tree_status:
                return self._status(repo.tree_status, repo.tree_error_code, "Access denied")
            entries: list[dict[str, Any]] = []
            folders = sorted({p.rsplit("/", 1)[0] for p in repo.files if "/" in p})
            entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d}
                        for d in folders]  # fmt: skip
            for name, f in sorted(repo.files.items()):
                entry: dict[str, Any] = {"type": "file", "oid": f.git_oid, "size": f.size,
                                         "path": name}  # fmt: skip
                if f.lfs:
                    entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
                lie = dict(f.listed)
                if "lfs" in lie and "lfs" in entry:
                    entry["lfs"].update(lie.pop("lfs"))
                entry.update(lie)
                entries.append(entry)
            body = json.dumps(entries).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _file(self, name: str, f: HubFile, head: bool, cdn: bool = False) -> None:
            fault = f.fault
            if not cdn and fault.token and \
                    self.headers.get("Authorization") != f"Bearer {fault.token}":
                return self._status(401, "GatedRepo", "Access to this model is restricted")
            if not cdn and fault.redirect:
                self.send_response(302)
                self.send_header("Location", f"/cdn/{name}?X-Amz-Signature=fake")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if fault.status:
                return self._status(fault.status, fault.error_code, "Access to this model is "
                                    "restricted" if fault.status in (401, 403) else "")
            start, end = 0, f.size
            rng = None if fault.ignore_range else self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                first, _, last = rng[6:].partition("-")
                start = int(first or 0)
                end = int(last) + 1 if last else f.size
                if start >= f.size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{f.size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            self.send_response(206 if rng else 200)
            etag = f'"{f.sha256}"' if f.lfs else f'"{f.git_oid}"'
            self.send_header("ETag", etag)
            self.send_header("X-Linked-Etag", etag)
            self.send_header("X-Linked-Size", str(f.size))
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{f.size}")
            self.send_header("Content-Length", str(end - start))
            self.end_headers()
            if head:
                return
            drop = None
            with hub.lock:
                if fault.drop_after is not None and fault.drop_times > 0:
                    fault.drop_times -= 1
                    drop = fault.drop_after
            self._body(name, f, start, end, drop)

        def _body(self, name: str, f: HubFile, start: int, end: int, drop: int | None) -> None:
            content = f.content()
            fault = f.fault
            chunk = 4096 if fault.bytes_per_s else SEND_CHUNK
            pos = start
            limit = end if drop is None else min(end, max(drop, start))
            try:
                while pos < limit:  # bounded: the file's size
                    n = min(chunk, limit - pos)
                    piece = bytes(content[pos:pos + n]) if fault.flip_byte_at is not None \
                        else memoryview(content)[pos:pos + n]  # fmt: skip
                    if fault.flip_byte_at is not None and pos <= fault.flip_byte_at < pos + n:
                        buf = bytearray(piece)
                        buf[fault.flip_byte_at - pos] ^= 0xFF
                        piece = bytes(buf)
                    self.wfile.write(piece)
                    pos += n
                    with hub.lock:
                        hub.sent[name] = hub.sent.get(name, 0) + n
                    if fault.bytes_per_s:
                        time.sleep(n / fault.bytes_per_s)
            except (BrokenPipeError, ConnectionResetError):
                return
            if drop is not None and pos < end:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)  # mid-body: the client sees the connection drop

    return Handler

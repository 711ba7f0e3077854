"""One file from the hub: resumable, verified, and shared between concurrent pulls.

Why not ``hf_hub_download``: measured with huggingface_hub 2.4.0 against a loopback fake hub,
a file with one byte flipped was accepted (it checks the size, not the SHA-256), and after a
connection dropped half way its retry fetched the whole file again. Here:

- bytes go to ``<models dir>/.partial/<sha256>.<repo>.part`` (hidden from ``list``/``run``;
  ``<repo>`` tags the repository, so one repository's partial file is never taken for
  another's), appended
  with HTTP ``Range`` requests, so Ctrl-C, a dropped connection or a killed process costs only
  what was in flight; a resumed pull re-hashes the prefix on disk once;
- the SHA-256 is computed while streaming (no second pass) and compared with the hub's LFS
  hash before the file is renamed into place (atomic); a mismatch deletes it;
- an ``flock`` on ``<sha256>.<repo>.lock`` makes a second pull of the same file wait for the
  first and report its progress (read from the partial file's size) instead of downloading it
  again; the lock file goes when the pull ends, however it ends;
- every path is checked to stay in the models dir before it is opened (:func:`store.contained`),
  and files are opened without following a link.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import http.client
import io
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from modeld.errors import (
    CancelledError,
    DiskFullError,
    ModeldError,
    ModelNotFoundError,
    NetworkError,
    UnauthorizedError,
    VerificationError,
    format_bytes,
)
from modeld.pull.interrupt import interrupt_on
from modeld.pull.store import (
    PARTIAL_DIR,
    contained,
    nofollow,
    prune_empty,
    read_record,
    record_path,
    write_record,
)

CHUNK = 1 << 20
WRITE_BACK = 32 << 20  # bytes written between two write-back starts (see _write_back)
SINK_QUEUE = 6  # chunks waiting to be written and hashed
RING = SINK_QUEUE + 3  # receive buffers: queued, being written, being filled, spare
READ_TIMEOUT_S = 60.0
RETRIES = 5  # consecutive failed attempts (no byte gained) before giving up
WAIT_POLL_S = 0.2

#: (phase, completed bytes, total bytes); phases: "waiting" (another pull has the file),
#: "resuming" (re-hashing what is on disk), "downloading", "verifying".
ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Transfer:
    """What to fetch and where it goes."""

    url: str
    size: int
    sha256: str | None  # the hub's LFS hash; None: check the git blob id instead
    git_oid: str
    target: Path
    models_dir: Path  # nothing is written or deleted outside it
    repo_id: str
    headers: dict[str, str] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)  # written next to the file

    @property
    def key(self) -> str:
        """The file's hash and a tag of its repository (validated hex and hex: a safe name)."""
        tag = hashlib.sha256(self.repo_id.lower().encode()).hexdigest()[:16]
        return f"{self.sha256 or f'git-{self.git_oid}'}.{tag}"

    @property
    def partial_dir(self) -> Path:
        return self.models_dir / PARTIAL_DIR

    @property
    def partial(self) -> Path:
        """Where the bytes gather until verified (hidden: ``.partial/`` in the models dir)."""
        return self.partial_dir / f"{self.key}.part"

    @property
    def lock(self) -> Path:
        return self.partial_dir / f"{self.key}.lock"

    @property
    def digest(self) -> str:
        """The digest as Ollama shows it: ``sha256:<hex>``."""
        return f"sha256:{self.sha256}" if self.sha256 else f"git-sha1:{self.git_oid}"


@dataclass
class Result:
    target: Path
    fetched_bytes: int = 0  # bytes this process received from the network
    resumed_from: int = 0  # bytes already on disk when the transfer started
    shared: bool = False  # another pull downloaded it while this one waited
    present: bool = False  # the verified file was already in place


class _Retryable(Exception):
    """A failure worth another attempt (the connection dropped, a 5xx, a timeout)."""


class _Sink:
    """Where received bytes go: appended to the partial file and hashed (SHA-256 of the
    content, or git's blob id: sha1 of a header and the content) on a thread of its own, so the
    receiving thread only receives. hashlib and file writes release the GIL: receiving, writing
    and hashing overlap (the pull benchmark: the receiver doing all three reached 0.70 of curl).

    ``done``: bytes written *and* hashed. :meth:`drain` waits for what is queued and raises what
    the thread met (a full disk); call it before reading ``done`` or the file.
    """

    def __init__(self, t: Transfer, f: io.BufferedRandom, done: int = 0) -> None:
        self.t, self.f, self.done = t, f, done
        self.git = t.sha256 is None
        self.h = hashlib.sha1(f"blob {t.size}\0".encode()) if self.git else hashlib.sha256()
        self._queue: queue.Queue[bytes | memoryview | None] = queue.Queue(maxsize=SINK_QUEUE)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def put(self, data: bytes | memoryview) -> None:
        """Write and hash ``data`` (not to be changed until :data:`SINK_QUEUE` + 2 later
        puts, or a drain: it is used later, on the thread)."""
        if self._error is not None:
            self.drain()  # raises it
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pull-sink", daemon=True)
            self._thread.start()
        self._queue.put(data)

    def _run(self) -> None:
        flushed = self.done  # written back to disk, or on its way (see _write_back)
        while (data := self._queue.get()) is not None:
            if self._error is not None:
                continue  # failed: drop the rest, the receiver hears of it on its next put
            try:
                _write(self.f, data, self.t)
                self.h.update(data)
                self.done += len(data)
                if self.done - flushed >= WRITE_BACK:
                    _write_back(self.f, flushed, self.done)
                    flushed = self.done
            except BaseException as exc:  # handed to the receiving thread (a full disk)
                self._error = exc

    def drain(self) -> None:
        """Wait until everything queued is written and hashed; raise what failed."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def hexdigest(self) -> str:
        self.drain()
        return self.h.hexdigest()

    def restart(self) -> None:
        """The server sends the whole file again: start the partial file over."""
        self.drain()
        self.f.truncate(0)
        self.f.seek(0)
        self.done = 0
        self.h = hashlib.sha1(f"blob {self.t.size}\0".encode()) if self.git else hashlib.sha256()


def fetch(t: Transfer, on_progress: ProgressFn | None = None,
          cancel: threading.Event | None = None) -> Result:
    """Download ``t`` into ``t.target`` (verified), resuming any partial file; see module doc."""
    report = on_progress or (lambda phase, done, total: None)
    for path in (t.partial_dir, t.partial, t.lock, t.target, record_path(t.target)):
        contained(t.models_dir, path)
    t.partial_dir.mkdir(parents=True, exist_ok=True)
    lock, shared = _acquire(t, report, cancel)
    with lock:
        try:
            if _in_place(t):
                return Result(t.target, shared=shared, present=not shared)
            return _download(t, t.partial, report, cancel)
        finally:  # still held: no other pull uses this name now; a waiter reopens it
            with contextlib.suppress(FileNotFoundError):
                if t.partial.stat().st_size == 0:
                    t.partial.unlink()  # nothing to resume (a 404, a refused connection)
            t.lock.unlink(missing_ok=True)


def _in_place(t: Transfer) -> bool:
    """The verified file is already where it belongs (its record has the same hash)."""
    if not t.target.is_file() or t.target.stat().st_size != t.size:
        return False
    record = read_record(t.target) or {}
    return record.get("digest") == t.digest


def _acquire(t: Transfer, report: ProgressFn,
             cancel: threading.Event | None) -> tuple[IO[bytes], bool]:
    """The file's lock, taken; while another pull holds it, report that pull's progress.
    Also whether this pull had to wait. A lock file deleted while this pull waited for it
    (its holder finished) is opened again: two pulls never hold two inodes of one name."""
    waited = False
    while True:
        lock = open(t.lock, "a+b", opener=nofollow)  # noqa: SIM115 (returned open)
        while True:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = True
            try:
                _check_cancel(cancel)
            except BaseException:
                lock.close()
                raise
            try:
                have = t.partial.stat().st_size
            except FileNotFoundError:
                have = t.size if t.target.exists() else 0
            report("waiting", min(have, t.size), t.size)
            time.sleep(WAIT_POLL_S)
        try:
            same = os.stat(t.lock, follow_symlinks=False).st_ino == os.fstat(lock.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return lock, waited
        lock.close()


def _check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise CancelledError("the pull was cancelled", hint="pull again: it resumes")


def _download(t: Transfer, part: Path, report: ProgressFn,
              cancel: threading.Event | None) -> Result:
    result = Result(t.target)
    with open(part, "a+b", opener=nofollow) as f:
        have = f.seek(0, os.SEEK_END)
        if have > t.size:
            f.truncate(0)
            have = 0
        sink = _rehash(f, have, t, report)
        result.resumed_from = have
        _transfer(t, f, sink, report, cancel, result)  # drains the sink, however it ends
        report("verifying", sink.done, t.size)
        f.flush()
        os.fsync(f.fileno())  # what is renamed into place is on disk
    got = sink.hexdigest()
    want = t.sha256 or t.git_oid
    if got != want:
        part.unlink(missing_ok=True)
        kind = "git blob id" if sink.git else "SHA-256"
        raise VerificationError(
            f"{t.target.name} failed verification: the hub's {kind} is {want}, the downloaded "
            f"file's is {got}; the file was deleted",
            hint="pull again; if it fails again the hub (or a proxy or mirror on the way) "
            "serves a corrupted file",
            details={"file": t.target.name, "expected": want, "actual": got, "url": t.url},
        )
    t.target.parent.mkdir(parents=True, exist_ok=True)
    try:
        contained(t.models_dir, t.target)
        write_record(t.target, {**t.record, "digest": t.digest, "size": t.size})
        os.replace(part, t.target)
    except BaseException:
        record_path(t.target).unlink(missing_ok=True)
        prune_empty(t.target.parent, t.models_dir)  # no empty ORG/REPO folder left behind
        raise
    return result


def _transfer(t: Transfer, f: io.BufferedRandom, sink: _Sink, report: ProgressFn,
              cancel: threading.Event | None, result: Result) -> None:
    """Attempts until the file is complete; a failed one resumes from what was written."""
    failures = 0
    while sink.done < t.size:
        _check_cancel(cancel)
        before = sink.done
        try:
            _attempt(t, f, sink, report, cancel, result)
        except _Retryable as exc:
            _check_cancel(cancel)  # the connection was shut because the pull was cancelled
            f.truncate(sink.done)  # bytes written but not counted (a write cut short) go
            f.seek(0, os.SEEK_END)
            failures = 0 if sink.done > before else failures + 1
            if failures >= RETRIES:
                raise NetworkError(
                    f"downloading {t.target.name} failed {failures} times: {exc}",
                    hint="check the network connection, then pull again: it resumes "
                    f"from {format_bytes(sink.done)}",
                    details={"url": t.url, "completed": sink.done, "total": t.size},
                ) from exc
            time.sleep(min(0.25 * 2**failures, 4.0))


def _rehash(f: io.BufferedRandom, have: int, t: Transfer, report: ProgressFn) -> _Sink:
    """A sink for ``f`` that has hashed what a previous attempt left on disk (once per resumed
    pull)."""
    sink = _Sink(t, f, have)
    if have == 0:
        return sink
    f.seek(0)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    seen = 0
    while seen < have:
        n = f.readinto(view[: min(CHUNK, have - seen)])
        if not n:
            break
        sink.h.update(view[:n])  # synchronously: the buffer is reused
        seen += n
        if seen % (64 * CHUNK) < n or seen == have:
            report("resuming", seen, t.size)
    f.seek(0, os.SEEK_END)
    return sink


def _attempt(t: Transfer, f: io.BufferedRandom, sink: _Sink, report: ProgressFn,
             cancel: threading.Event | None, result: Result) -> None:
    """One HTTP request from byte ``sink.done`` on, appending to ``f`` (through ``sink``,
    drained before this returns or raises)."""
    req = urllib.request.Request(t.url)
    for key, value in t.headers.items():
        if key.lower() == "authorization":
            req.add_unredirected_header(key, value)  # never to the CDN a redirect points at
        else:
            req.add_header(key, value)
    if sink.done:
        req.add_header("Range", f"bytes={sink.done}-")
    try:
        resp = urllib.request.urlopen(req, timeout=READ_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and sink.done:
            sink.restart()  # the server disagrees about what we have: start over
            raise _Retryable("HTTP 416 for a resumed range") from None
        raise _http_error(exc, t) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise _Retryable(_reason(exc)) from exc
    with resp, interrupt_on(cancel, resp):
        if sink.done and (resp.status != 206 or not _range_starts_at(resp, sink.done)):
            sink.restart()  # the server ignored Range (or sent another): the whole body
            if resp.status == 206:
                raise _Retryable("the server answered another range than asked")
        try:
            _receive(t, resp, sink, report, cancel, result)
        finally:
            sink.drain()  # written and hashed before anyone reads sink.done or the file


def _receive(t: Transfer, resp: http.client.HTTPResponse, sink: _Sink, report: ProgressFn,
             cancel: threading.Event | None, result: Result) -> None:
    """Read the body into ``sink`` until the file is complete."""
    last = 0.0
    received = sink.done
    # Plain (not chunked) bodies are read straight into a ring of reused buffers instead of a
    # fresh 1 MiB object per read (allocated and faulted in each time; the pull benchmark went
    # from 0.71 to 0.80 of curl). readinto1: what has arrived (readinto would wait for a whole
    # CHUNK).
    raw = resp.fp if not resp.chunked and resp.fp is not None else None
    ring = [bytearray(CHUNK) for _ in range(RING)] if raw is not None else []
    turn = 0
    while received < t.size:
        try:
            if raw is not None:
                buf = ring[turn % RING]
                turn += 1
                data = memoryview(buf)[: raw.readinto1(buf)]
            else:
                data = memoryview(resp.read1(CHUNK))
        except (OSError, http.client.HTTPException) as exc:
            raise _Retryable(_reason(exc)) from exc
        if not data:
            raise _Retryable(f"the connection closed at {received} of {t.size} bytes")
        n = min(len(data), t.size - received)
        sink.put(data[:n])
        received += n
        result.fetched_bytes += n
        now = time.monotonic()
        if now - last >= 0.1 or received == t.size:
            last = now
            report("downloading", received, t.size)
            _check_cancel(cancel)


def _write_back(f: io.BufferedRandom, start: int, end: int) -> None:
    """Start writing ``[start, end)`` of ``f`` to disk now, without waiting for it, so the
    fsync before the rename has little left to do: it cost 0.35–2.5 s per GiB at the end (0.78
    of curl's rate, which does not fsync). Linux's ``sync_file_range(SYNC_FILE_RANGE_WRITE)``
    keeps the pages cached (the model is loaded from them next; ``posix_fadvise`` DONTNEED,
    which also starts write-back, dropped 44 % of them). Elsewhere: nothing, the fsync does it."""
    f.flush()
    call = _sync_file_range()
    if call is not None:
        call(f.fileno(), start, end - start, 2)  # SYNC_FILE_RANGE_WRITE; a failure: fsync's


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], fn)


def _range_starts_at(resp: http.client.HTTPResponse, offset: int) -> bool:
    """A 206's ``Content-Range: bytes START-END/TOTAL`` starts where the partial file ends."""
    value = resp.headers.get("Content-Range", "")
    start = value.removeprefix("bytes ").split("-", 1)[0].strip()
    return start.isdigit() and int(start) == offset


def _write(f: io.BufferedRandom, data: bytes | memoryview, t: Transfer) -> None:
    try:
        f.write(data)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise DiskFullError(
                f"the disk is full while writing {t.target.name}: {exc.strerror}",
                hint=f"free space in {t.partial_dir.parent} (or set MODELD_MODELS elsewhere), "
                "then pull again: it resumes",
                details={"path": str(t.partial_dir), "errno": exc.errno},
            ) from None
        raise


def _http_error(exc: urllib.error.HTTPError, t: Transfer) -> ModeldError | _Retryable:
    from modeld.pull.hub import TOKEN_HINT

    details: dict[str, object] = {"url": t.url, "status": exc.code}
    if exc.code in (401, 403):
        return UnauthorizedError(f"the hub refused {t.target.name} (HTTP {exc.code})",
                                 hint=TOKEN_HINT, details=details)
    if exc.code == 404:
        return ModelNotFoundError(f"the hub has no file at {t.url}",
                                  hint="the repository changed since it was listed: pull again",
                                  details=details)
    if exc.code == 429 or exc.code >= 500:
        return _Retryable(f"HTTP {exc.code}")
    return NetworkError(f"the hub answered HTTP {exc.code} for {t.target.name}",
                        hint="try again later", details=details)


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason if reason is not None else exc) or type(exc).__name__

"""The GGUF binary format, read fast and checked: header, key/value metadata and tensor table.

Why not ``gguf.GGUFReader``: it parses every array element in Python (about 8 s for
gemma-3-270m's 262k-token vocabulary). This reader skips array contents (string arrays are
walked by their length prefixes without decoding) and reads only the small numeric arrays that
matter (per-layer head counts, sliding-window patterns), so the same model takes a few tens of
milliseconds. It is stdlib-only so the daemon and CLI can import it cheaply.

Every field is validated against the file size before anything is allocated or looped over;
malformed input raises :class:`~modeld.errors.InvalidModelError` naming the file and the
problem, never another exception, because llama.cpp would abort the process on the same file.
Kept apart from :mod:`modeld.model.gguf`, which reads what a model or projector *is* out of
the :class:`Header` this module returns: the byte layout and its safety checks are one job.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO

from modeld.errors import InvalidModelError, ModelNotFoundError
from modeld.model.ggufarch import GGML_TYPES, ggml_type_size
from modeld.model.modelinfo import TensorInfo

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_TENSOR_NAME = 63  # llama.cpp: GGML_MAX_NAME (64) including the terminating NUL
MAX_KEY_LENGTH = 65535
SMALL_ARRAY_LIMIT = 4096  # numeric arrays up to this many elements are read, longer ones skipped
_CHUNK = 1 << 20
_INT64_MAX = (1 << 63) - 1

# GGUF value types: id -> (struct format, size) for fixed-size scalars.
_STRING, _ARRAY = 8, 9
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<B", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}  # fmt: skip
_BOOL = 7
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class Reader:
    """Buffered little-endian reader that checks every length against the file size."""

    def __init__(self, f: BinaryIO, size: int, path: str) -> None:
        self.f = f
        self.size = size
        self.path = path
        self.buf = b""
        self.i = 0  # index into buf
        self.base = 0  # file offset of buf[0]

    @property
    def pos(self) -> int:
        return self.base + self.i

    def fail(self, problem: str, hint: str = "") -> InvalidModelError:
        return InvalidModelError(
            f"{self.path}: invalid GGUF file: {problem}",
            hint=hint or "re-download or re-convert the model; the file is damaged or not GGUF",
            details={"path": self.path, "offset": self.pos},
        )

    def truncated(self, what: str) -> InvalidModelError:
        return self.fail(
            f"truncated while reading {what} at offset {self.pos} (file is {self.size} bytes)",
            "the file is incomplete (interrupted download?); download it again",
        )

    def need(self, n: int, what: str) -> None:
        """Make ``n`` bytes available at the cursor."""
        have = len(self.buf) - self.i
        if have >= n:
            return
        if self.pos + n > self.size:
            raise self.truncated(what)
        end = self.base + len(self.buf)
        self.f.seek(end)
        more = self.f.read(min(max(n - have, _CHUNK), self.size - end))  # never past the file
        self.buf = self.buf[self.i :] + more
        self.base += self.i
        self.i = 0
        if len(self.buf) < n:  # the file shrank while we read it
            raise self.truncated(what)

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        out = self.buf[self.i : self.i + n]
        self.i += n
        return out

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.i)
        self.i += 4
        return int(v)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.i)
        self.i += 8
        return int(v)

    def seek_to(self, target: int, what: str) -> None:
        if target > self.size:
            raise self.truncated(what)
        if self.base <= target <= self.base + len(self.buf):
            self.i = target - self.base
        else:
            self.buf, self.base, self.i = b"", target, 0

    def skip(self, n: int, what: str) -> None:
        self.seek_to(self.pos + n, what)

    def raw_string(self, what: str, limit: int | None = None) -> bytes:
        n = self.u64(f"{what} length")
        if limit is not None and n > limit:
            raise self.fail(f"{what} is {n} bytes long (limit {limit})")
        if n > self.size - self.pos:
            raise self.truncated(what)
        return self.take(n, what)

    def string(self, what: str, limit: int | None = None) -> str:
        raw = self.raw_string(what, limit)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid UTF-8 ({exc.reason})") from None

    def skip_strings(self, count: int, what: str) -> int:
        """Skip ``count`` length-prefixed strings without decoding or copying them; the
        longest one's length in bytes."""
        if count > (self.size - self.pos) // 8:
            raise self.fail(f"{what} claims {count} strings, more than the file can hold")
        unpack = _U64.unpack_from
        left, longest = count, 0
        while left:
            self.need(8, what)
            buf, i, k = self.buf, self.i, 0
            last = len(buf) - 8
            while k < left and i <= last:
                n = unpack(buf, i)[0]
                longest = n if n > longest else longest
                i += 8 + n
                k += 1
            left -= k
            self.seek_to(self.base + i, what)  # may land past the buffer: re-reads from there
        return longest


def _absurd_count(r: Reader, what: str, count: int, min_size: int) -> None:
    if count > (r.size - r.pos) // min_size:
        raise r.fail(f"{what} is {count}, more than a {r.size}-byte file can hold")


@dataclass
class Header:
    """Raw parse result: metadata (small numeric arrays read, others only counted), tensors."""

    version: int = 0
    scalars: dict[str, str | int | float | bool] = field(default_factory=dict)
    arrays: dict[str, tuple[int | float | bool, ...]] = field(default_factory=dict)
    array_lengths: dict[str, int] = field(default_factory=dict)
    longest_strings: dict[str, int] = field(default_factory=dict)  # of string arrays, in bytes
    tensors: list[TensorInfo] = field(default_factory=list)
    data_offset: int = 0


def _read_value(r: Reader, h: Header, key: str, vtype: int) -> None:
    if vtype in _SCALARS:
        fmt, size = _SCALARS[vtype]
        (v,) = struct.unpack(fmt, r.take(size, f"value of {key}"))
        h.scalars[key] = bool(v) if vtype == _BOOL else v
    elif vtype == _STRING:
        h.scalars[key] = r.string(f"value of {key}")
    elif vtype == _ARRAY:
        etype = r.u32(f"element type of {key}")
        count = r.u64(f"length of {key}")
        h.array_lengths[key] = count
        if etype == _STRING:
            h.longest_strings[key] = r.skip_strings(count, f"array {key}")
        elif etype in _SCALARS:
            fmt, size = _SCALARS[etype]
            _absurd_count(r, f"length of array {key}", count, size)
            if count <= SMALL_ARRAY_LIMIT:
                raw = r.take(count * size, f"array {key}")
                vals = struct.unpack(f"<{count}{fmt[1]}", raw)
                h.arrays[key] = tuple(bool(v) for v in vals) if etype == _BOOL else vals
            else:
                r.skip(count * size, f"array {key}")
        elif etype == _ARRAY:
            raise r.fail(f"{key} is a nested array, which llama.cpp does not support")
        else:
            raise r.fail(f"{key} has unknown array element type {etype}")
    else:
        raise r.fail(f"{key} has unknown value type {vtype}")


def read_header(r: Reader, *, stop_after_key: str | None = None) -> Header:
    h = Header()
    magic = r.take(4, "magic") if r.size >= 4 else b""
    if magic != GGUF_MAGIC:
        raise r.fail(
            # never the bytes it found: a caller must not learn a file's first bytes from this
            f"not a GGUF file (it does not begin with {GGUF_MAGIC!r})",
            "modeld loads GGUF models only; convert other formats with llama.cpp's tools",
        )
    h.version = r.u32("version")
    if h.version not in SUPPORTED_VERSIONS:
        extra = " (a big-endian file?)" if h.version >= 1 << 16 else ""
        raise r.fail(
            f"unsupported GGUF version {h.version}{extra}; supported: 2, 3",
            "re-convert the model with a current llama.cpp",
        )
    n_tensors = r.u64("tensor count")
    n_kv = r.u64("metadata count")
    # Smallest possible entries: kv = 8 (key len) + 1 + 4 (type) + 1; tensor = 8 + 1 + 4 + 4 + 8.
    _absurd_count(r, "metadata count", n_kv, 14)
    _absurd_count(r, "tensor count", n_tensors, 25)
    for _ in range(n_kv):
        key = r.string("metadata key", MAX_KEY_LENGTH)
        if key in h.scalars or key in h.array_lengths:
            raise r.fail(f"duplicate metadata key {key!r}")
        _read_value(r, h, key, r.u32(f"type of {key}"))
        if key == stop_after_key:
            return h
    if stop_after_key is not None:
        return h
    alignment = h.scalars.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise r.fail(f"general.alignment {alignment!r} is not a power of two")
    names: set[str] = set()
    for _ in range(n_tensors):
        name = r.string("tensor name", MAX_TENSOR_NAME)
        if name in names:
            raise r.fail(f"duplicate tensor {name!r}")
        names.add(name)
        n_dims = r.u32(f"dimension count of {name}")
        if n_dims > MAX_DIMS:
            raise r.fail(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
        shape = tuple(r.u64(f"shape of {name}") for _ in range(n_dims))
        elements = 1
        for d in shape:
            elements *= d
            if d > _INT64_MAX or elements > _INT64_MAX:
                raise r.fail(f"tensor {name!r} has an absurd shape {shape}")
        ggml_type = r.u32(f"type of {name}")
        offset = r.u64(f"offset of {name}")
        if ggml_type not in GGML_TYPES:
            raise r.fail(
                f"tensor {name!r} has unknown ggml type {ggml_type}",
                "this llama.cpp build may be too old for the file's quantization",
            )
        try:
            n_bytes = ggml_type_size(ggml_type, shape)
        except ValueError as exc:
            raise r.fail(f"tensor {name!r}: {exc}") from None
        if offset % alignment:
            raise r.fail(f"tensor {name!r} offset {offset} is not aligned to {alignment}")
        h.tensors.append(
            TensorInfo(name, ggml_type, GGML_TYPES[ggml_type][0], shape, n_bytes, offset)
        )
    h.data_offset = -(-r.pos // alignment) * alignment
    for t in h.tensors:
        end = h.data_offset + t.offset + t.n_bytes
        if end > r.size:
            raise r.fail(
                f"tensor {t.name!r} data ends at byte {end}, past the end of the file "
                f"({r.size} bytes)",
                "the file is incomplete (interrupted download?); download it again",
            )
    return h


@contextmanager
def open_gguf(path: str | os.PathLike[str]) -> Iterator[Reader]:
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise ModelNotFoundError(
            f"{p}: no such file", hint="check the path, or run `modeld list` to see known models"
        ) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise InvalidModelError(f"{p!r}: cannot read: {reason}", hint="check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise InvalidModelError(
            f"{p}: is a directory, not a GGUF file", hint="pass the path of a .gguf file"
        )
    if not stat.S_ISREG(st.st_mode):  # a FIFO or device could block or never end
        raise InvalidModelError(f"{p}: is not a regular file", hint="pass the path of a .gguf file")
    try:
        with open(p, "rb") as f:
            yield Reader(f, os.fstat(f.fileno()).st_size, p)
    except OSError as exc:
        raise InvalidModelError(
            f"{p}: cannot read: {exc.strerror or exc}", hint="check the file's permissions"
        ) from None

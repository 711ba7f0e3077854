"""Fast GGUF metadata reader: header, key/value metadata and tensor table, nothing else.

Why not ``gguf.GGUFReader``: it parses every array element in Python (about 8 s for
gemma-3-270m's 262k-token vocabulary). This reader skips array contents (string arrays are
walked by their length prefixes without decoding) and reads only the small numeric arrays that
matter (per-layer head counts, sliding-window patterns), so the same model takes a few tens of
milliseconds. It is stdlib-only so the daemon and CLI can import it cheaply.

Every field is validated against the file size before anything is allocated or looped over;
malformed input raises :class:`~modeld.errors.InvalidModelError` naming the file and the
problem, never another exception, because llama.cpp would abort the process on the same file.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO

from modeld.errors import InvalidModelError, ModelNotFoundError
from modeld.model import ggufarch
from modeld.model.ggufarch import GGML_TYPES as GGML_TYPES  # re-exported
from modeld.model.ggufarch import ggml_type_size as ggml_type_size
from modeld.model.ggufarch import quantization_name as quantization_name
from modeld.model.modelinfo import ModelInfo, TensorInfo

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_TENSOR_NAME = 63  # llama.cpp: GGML_MAX_NAME (64) including the terminating NUL
MAX_KEY_LENGTH = 65535
MAX_LAYERS = 4096  # llama.cpp's LLAMA_MAX_LAYERS is 512; anything far past it is corrupt
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


class _Reader:
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

    def skip_strings(self, count: int, what: str) -> None:
        """Skip ``count`` length-prefixed strings without decoding or copying them."""
        if count > (self.size - self.pos) // 8:
            raise self.fail(f"{what} claims {count} strings, more than the file can hold")
        unpack = _U64.unpack_from
        left = count
        while left:
            self.need(8, what)
            buf, i, k = self.buf, self.i, 0
            last = len(buf) - 8
            while k < left and i <= last:
                i += 8 + unpack(buf, i)[0]
                k += 1
            left -= k
            self.seek_to(self.base + i, what)  # may land past the buffer: re-reads from there


def _absurd_count(r: _Reader, what: str, count: int, min_size: int) -> None:
    if count > (r.size - r.pos) // min_size:
        raise r.fail(f"{what} is {count}, more than a {r.size}-byte file can hold")


@dataclass
class _Header:
    """Raw parse result: metadata (small numeric arrays read, others only counted), tensors."""

    version: int = 0
    scalars: dict[str, str | int | float | bool] = field(default_factory=dict)
    arrays: dict[str, tuple[int | float | bool, ...]] = field(default_factory=dict)
    array_lengths: dict[str, int] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    data_offset: int = 0


def _read_value(r: _Reader, h: _Header, key: str, vtype: int) -> None:
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
            r.skip_strings(count, f"array {key}")
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


def _read_header(r: _Reader, *, stop_after_key: str | None = None) -> _Header:
    h = _Header()
    magic = r.take(4, "magic") if r.size >= 4 else b""
    if magic != GGUF_MAGIC:
        raise r.fail(
            f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})",
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
def _open(path: str | os.PathLike[str]) -> Iterator[_Reader]:
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
            yield _Reader(f, os.fstat(f.fileno()).st_size, p)
    except OSError as exc:
        raise InvalidModelError(
            f"{p}: cannot read: {exc.strerror or exc}", hint="check the file's permissions"
        ) from None


def read_chat_template(path: str | os.PathLike[str]) -> str | None:
    """The model's default chat template (``tokenizer.chat_template``), or None."""
    key = "tokenizer.chat_template"
    with _open(path) as r:
        value = _read_header(r, stop_after_key=key).scalars.get(key)
    return value if isinstance(value, str) else None


def read_model_info(path: str | os.PathLike[str]) -> ModelInfo:
    """Parse a GGUF file's header into a :class:`ModelInfo` without touching tensor data."""
    with _open(path) as r:
        h = _read_header(r)
        notes = _add_split_shards(r, h)
        return _build_info(r, h, notes)


@dataclass(frozen=True)
class ProjectorInfo:
    """An image projector file (``mmproj``, architecture ``clip``): what modeld plans with."""

    path: str
    file_size: int
    tensor_bytes: int
    projector_type: str
    vision: bool
    image_size: int
    patch_size: int
    embedding_length: int  # the vision tower's width
    feed_forward_length: int
    projection_dim: int | None  # the text model's width, where the file says it


def read_projector_info(path: str | os.PathLike[str]) -> ProjectorInfo:
    """Parse a projector's header (InvalidModelError when the file is no projector)."""
    with _open(path) as r:
        h = _read_header(r)
        s = h.scalars
        if s.get("general.architecture") != "clip":
            raise r.fail("this GGUF is not an image projector (general.architecture is "
                         f"{s.get('general.architecture')!r}, not 'clip')",
                         "pass the model's mmproj file")  # fmt: skip

        def num(key: str) -> int:
            v = s.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else 0

        kind = s.get("clip.projector_type") or s.get("clip.vision.projector_type") or ""
        return ProjectorInfo(
            path=r.path, file_size=r.size, tensor_bytes=sum(t.n_bytes for t in h.tensors),
            projector_type=str(kind), vision=s.get("clip.has_vision_encoder") is True,
            image_size=num("clip.vision.image_size"), patch_size=num("clip.vision.patch_size"),
            embedding_length=num("clip.vision.embedding_length"),
            feed_forward_length=num("clip.vision.feed_forward_length"),
            projection_dim=num("clip.vision.projection_dim") or None,
        )


_SHARD_NAME = re.compile(r"^(?P<base>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def _add_split_shards(r: _Reader, h: _Header) -> list[str]:
    """For a split model (gguf-split), append the other shards' tensors to the table.

    Only the first shard holds the metadata; memory figures must cover every shard.
    """
    count, no = h.scalars.get("split.count"), h.scalars.get("split.no", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count <= 1:
        return []
    m = _SHARD_NAME.match(os.path.basename(r.path))
    if no != 0 or m is None or int(m["count"]) != count:
        raise r.fail(
            f"this is shard {no!r} of a {count}-part split model",
            "load the first shard, named like <model>-00001-of-000NN.gguf",
        )
    for i in range(2, count + 1):
        shard = os.path.join(os.path.dirname(r.path), f"{m['base']}-{i:05d}-of-{count:05d}.gguf")
        if not os.path.isfile(shard):
            raise r.fail(f"split model shard {shard} is missing", "download every shard")
        with _open(shard) as sr:
            h.tensors.extend(_read_header(sr).tensors)
    return [f"split model: {count} shards; tensor figures cover all of them"]


def _build_info(r: _Reader, h: _Header, notes: list[str]) -> ModelInfo:
    s = h.scalars
    arch = s.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        kind = s.get("general.type")
        raise r.fail(
            "general.architecture is missing" + (f" (general.type={kind})" if kind else ""),
            "this GGUF is not a model llama.cpp can run (an adapter or projector file?)",
        )

    def num(key: str, default: int | None = None, *, required: bool = False) -> int | None:
        v = _get_int(r, h, key)
        if v is None and required:
            raise r.fail(f"required key {key} is missing")
        return default if v is None else v

    def per_layer(key: str, default: int) -> tuple[int, ...] | None:
        if key in h.array_lengths:
            arr = h.arrays.get(key, ())
            if len(arr) != n_layer or h.array_lengths[key] != n_layer:
                raise r.fail(f"{key} has {h.array_lengths[key]} entries for {n_layer} layers")
            if not all(isinstance(x, int) and x >= 0 for x in arr):
                raise r.fail(f"{key} holds non-integer or negative values")
            return tuple(int(x) for x in arr)
        v = num(key, default)
        return None if v is None else (v,) * n_layer

    p = f"{arch}."
    ctx_len = num(p + "context_length", required=True) or 0
    n_layer = num(p + "block_count", required=True) or 0
    n_embd = num(p + "embedding_length", required=True) or 0
    if n_layer > MAX_LAYERS:
        raise r.fail(f"{p}block_count is {n_layer} (at most {MAX_LAYERS})")
    heads = per_layer(p + "attention.head_count", 0) or (0,) * n_layer
    n_head = max(heads, default=0)
    key_kv = p + "attention.head_count_kv"
    if key_kv in s or key_kv in h.array_lengths:
        heads_kv = per_layer(key_kv, n_head) or ()
    else:
        heads_kv = heads  # llama.cpp: n_head_kv defaults to n_head, layer by layer
    head_dim = n_embd // n_head if n_head else 0
    key_len = num(p + "attention.key_length", head_dim) or 0
    value_len = num(p + "attention.value_length", head_dim) or 0
    n_ff = num(p + "feed_forward_length", 0) or 0

    window, sliding = _sliding(r, h, arch, n_layer, notes)
    recurrent_note = ggufarch.recurrent_note(arch)
    if recurrent_note:
        notes.append(recurrent_note)

    vocab = num(p + "vocab_size")
    if vocab is None:
        vocab = h.array_lengths.get("tokenizer.ggml.tokens")
    if vocab is None:
        emb = next((t for t in h.tensors if t.name == "token_embd.weight"), None)
        vocab = emb.shape[1] if emb is not None and len(emb.shape) > 1 else 0

    file_type = num("general.file_type")
    quant = quantization_name(file_type)
    if quant is None and h.tensors:
        by_type: Counter[str] = Counter()
        for t in h.tensors:
            if len(t.shape) >= 2:
                by_type[t.type_name] += t.n_bytes
        if by_type:
            quant = by_type.most_common(1)[0][0]
            notes.append("quantization guessed from tensor types (general.file_type missing)")

    tok_model = s.get("tokenizer.ggml.model")
    name = s.get("general.name")
    size_label = s.get("general.size_label")
    return ModelInfo(
        path=os.path.abspath(r.path),
        file_size=r.size,
        gguf_version=h.version,
        architecture=arch,
        name=name if isinstance(name, str) else None,
        size_label=size_label if isinstance(size_label, str) else None,
        file_type=file_type,
        quantization=quant,
        context_length=ctx_len,
        block_count=n_layer,
        embedding_length=n_embd,
        head_count=n_head,
        head_count_kv=heads_kv,
        key_length=key_len,
        value_length=value_len,
        sliding_window=window,
        sliding_layers=sliding,
        vocab_size=vocab,
        has_chat_template="tokenizer.chat_template" in s,
        pooling_type=num(p + "pooling_type"),
        tensor_bytes=sum(t.n_bytes for t in h.tensors),
        tensor_count=len(h.tensors),
        data_offset=h.data_offset,
        recurrent=recurrent_note is not None,
        feed_forward_length=n_ff,
        expert_count=num(p + "expert_count", 0) or 0,
        tokenizer_model=tok_model if isinstance(tok_model, str) else None,
        bos_token_id=num("tokenizer.ggml.bos_token_id"),
        eos_token_id=num("tokenizer.ggml.eos_token_id"),
        tensors=tuple(h.tensors),
        scalars=dict(s),
        notes=tuple(notes),
    )


def _get_int(r: _Reader, h: _Header, key: str) -> int | None:
    """A non-negative integer key (the largest element of a per-layer array), or None."""
    v: object = h.scalars.get(key)
    if v is None and key in h.array_lengths:
        arr = h.arrays.get(key)
        if not arr:
            raise r.fail(f"{key} is an array too long to be a per-layer value")
        v = max(arr)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise r.fail(f"{key} should be a non-negative integer, got {v!r}")
    return v


def _sliding(
    r: _Reader, h: _Header, arch: str, n_layer: int, notes: list[str]
) -> tuple[int | None, tuple[bool, ...]]:
    """Sliding window size and per-layer flags (see :func:`ggufarch.sliding_layers`)."""
    key_p = f"{arch}.attention.sliding_window_pattern"
    pattern: int | tuple[bool, ...] | None
    if key_p in h.array_lengths:  # explicit per-layer flags
        flags = h.arrays.get(key_p, ())
        if len(flags) != n_layer or h.array_lengths[key_p] != n_layer:
            raise r.fail(f"{key_p} has {h.array_lengths[key_p]} entries for {n_layer} layers")
        pattern = tuple(bool(x) for x in flags)
    else:
        pattern = _get_int(r, h, key_p)
    window = _get_int(r, h, f"{arch}.attention.sliding_window")
    window, sliding, note = ggufarch.sliding_layers(arch, n_layer, window, pattern)
    if note:
        notes.append(note)
    return window, sliding

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
from modeld.modelinfo import ModelInfo, TensorInfo

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

# ggml type id -> (name, elements per block, bytes per block); mirrors ggml.h / gguf-py.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4),
    27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}  # fmt: skip

# llama_ftype (llama.h) -> short quantization name; general.file_type holds these values.
_FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_1_SOME_F16", 7: "Q8_0", 8: "Q5_0",
    9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S",
    15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS",
    21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S",
    27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    33: "Q4_0_4_4", 34: "Q4_0_4_8", 35: "Q4_0_8_8", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 1024: "GUESSED",
}  # fmt: skip

# GGUF value types: id -> (struct format, size) for fixed-size scalars.
_STRING, _ARRAY = 8, 9
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<B", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}  # fmt: skip
_BOOL = 7
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Per-architecture sliding-window defaults, mirroring hparams.set_swa_pattern() calls in
# llama.cpp's model loader: arch -> (period, dense_first, default window, needs window key).
# With period n, layer il slides iff il % n < n - 1 (dense_first: iff il % n != 0); n == 0
# means every layer slides. "needs window key": llama.cpp enables SWA only when the file
# sets {arch}.attention.sliding_window > 0.
_SWA_DEFAULTS: dict[str, tuple[int, bool, int | None, bool]] = {
    "gemma2": (2, False, 4096, False), "gemma3": (6, False, None, False),
    "gemma3n": (5, False, None, False), "gemma-embedding": (6, False, None, False),
    "cohere2": (4, False, None, False), "gpt-oss": (2, False, None, False),
    "llama4": (4, False, 8192, False),  # chunked attention, 8192-token chunks
    "olmo2": (4, False, None, True), "exaone4": (4, False, None, True),
    "exaone-moe": (4, False, None, True), "afmoe": (4, False, None, True),
    "smallthinker": (4, True, None, True), "modern-bert": (3, False, None, True),
}  # fmt: skip
# Architectures llama.cpp runs with a recurrent state (pure or hybrid with attention).
_RECURRENT = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
_HYBRID = frozenset(
    {
        "jamba", "falcon-h1", "granitehybrid", "plamo2", "nemotron_h", "nemotron_h_moe",
        "lfm2", "lfm2moe", "qwen3next", "qwen35", "qwen35moe", "kimi-linear",
    }
)  # fmt: skip


def ggml_type_size(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes of a contiguous tensor of ``shape`` (ne0 first); ValueError on bad input."""
    if ggml_type not in GGML_TYPES:
        raise ValueError(f"unknown ggml type {ggml_type}")
    _, block, type_size = GGML_TYPES[ggml_type]
    ne0 = shape[0] if shape else 1
    if ne0 % block:
        raise ValueError(f"first dimension {ne0} is not a multiple of the block size {block}")
    rows = 1
    for d in shape[1:]:
        rows *= d
    return ne0 // block * type_size * rows


def quantization_name(file_type: int | None) -> str | None:
    """``general.file_type`` (a llama_ftype) as a short name such as ``Q4_K_M``."""
    if file_type is None:
        return None
    return _FILE_TYPES.get(file_type, f"UNKNOWN_{file_type}")


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
    recurrent = arch in _RECURRENT or arch in _HYBRID
    if recurrent:
        kind = "recurrent" if arch in _RECURRENT else "hybrid recurrent/attention"
        notes.append(f"approximate: {arch} is a {kind} architecture; its state size is estimated")

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
        recurrent=recurrent,
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
    """Sliding window size and per-layer flags, as llama.cpp would set them."""
    none = (None, (False,) * n_layer)
    key_w = f"{arch}.attention.sliding_window"
    key_p = f"{arch}.attention.sliding_window_pattern"
    raw_w = _get_int(r, h, key_w)
    default = _SWA_DEFAULTS.get(arch)
    window = raw_w if raw_w is not None else (default[2] if default else None)
    if key_p in h.array_lengths:  # explicit per-layer flags
        flags = h.arrays.get(key_p, ())
        if len(flags) != n_layer or h.array_lengths[key_p] != n_layer:
            raise r.fail(f"{key_p} has {h.array_lengths[key_p]} entries for {n_layer} layers")
        sliding = tuple(bool(x) for x in flags)
        return (window, sliding) if window and any(sliding) else none
    period_raw = _get_int(r, h, key_p)
    if not window:
        return none
    if default is None and period_raw is None:
        if raw_w:
            notes.append(f"{key_w}={raw_w} is not used by llama.cpp for {arch}; full attention")
        return none
    if default is not None and default[3] and not raw_w:
        return none
    period = period_raw if period_raw is not None else (default[0] if default else 0)
    dense_first = default[1] if default else False
    if period == 0:
        sliding = (True,) * n_layer
    elif dense_first:
        sliding = tuple(il % period != 0 for il in range(n_layer))
    else:
        sliding = tuple(il % period < period - 1 for il in range(n_layer))
    if period_raw is None:
        notes.append(
            f"sliding-window layers follow llama.cpp's default for {arch} (period {period})"
        )
    return (window, sliding) if any(sliding) else none

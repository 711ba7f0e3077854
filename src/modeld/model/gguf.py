"""What a GGUF file says a model (or an image projector) is: :class:`ModelInfo` from its header.

The bytes are read and checked by :mod:`modeld.model.gguffile` (fast, stdlib-only, every
length checked against the file size); this module turns that header into what modeld plans
with: the architecture's dimensions, per-layer heads and sliding windows (llama.cpp's defaults
from :mod:`modeld.model.ggufarch`), the vocabulary, the quantization, the shards of a split
model. A file that does not make sense raises :class:`~modeld.errors.InvalidModelError`.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass

from modeld.model import ggufarch
from modeld.model.ggufarch import quantization_name
from modeld.model.gguffile import Header, Reader, open_gguf, read_header
from modeld.model.modelinfo import ModelInfo

MAX_LAYERS = 4096  # llama.cpp's LLAMA_MAX_LAYERS is 512; anything far past it is corrupt


def read_chat_template(path: str | os.PathLike[str]) -> str | None:
    """The model's default chat template (``tokenizer.chat_template``), or None."""
    key = "tokenizer.chat_template"
    with open_gguf(path) as r:
        value = read_header(r, stop_after_key=key).scalars.get(key)
    return value if isinstance(value, str) else None


def read_model_info(path: str | os.PathLike[str]) -> ModelInfo:
    """Parse a GGUF file's header into a :class:`ModelInfo` without touching tensor data."""
    with open_gguf(path) as r:
        h = read_header(r)
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
    with open_gguf(path) as r:
        h = read_header(r)
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


def _add_split_shards(r: Reader, h: Header) -> list[str]:
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
        with open_gguf(shard) as sr:
            h.tensors.extend(read_header(sr).tensors)
    return [f"split model: {count} shards; tensor figures cover all of them"]


def _build_info(r: Reader, h: Header, notes: list[str]) -> ModelInfo:
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
        # a piece decodes to at most its stored bytes in these two (SPM's "▁" is 3 bytes for
        # one space, a byte token "<0xNN>" 6 for one; GPT-2's byte-level letters 1-2 for one)
        token_bytes_max=h.longest_strings.get("tokenizer.ggml.tokens")
        if tok_model in ("llama", "gpt2") else None,
        bos_token_id=num("tokenizer.ggml.bos_token_id"),
        eos_token_id=num("tokenizer.ggml.eos_token_id"),
        tensors=tuple(h.tensors),
        scalars=dict(s),
        notes=tuple(notes),
    )


def _get_int(r: Reader, h: Header, key: str) -> int | None:
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
    r: Reader, h: Header, arch: str, n_layer: int, notes: list[str]
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

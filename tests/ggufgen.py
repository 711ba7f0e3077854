"""Generate small GGUF models with random weights that llama.cpp loads and runs.

Why: tests need real models of chosen shapes (tiny ones that load in milliseconds, GQA and
sliding-window ones for the memory estimate, large ones for eviction), and downloading them
is neither possible nor fast. Rules llama.cpp enforces (see docs DESIGN.md §10): every tensor
in the file must be used by the architecture's graph, the rope dimension equals the head size,
and an SPM (``llama``) vocabulary needs all 256 ``<0xNN>`` byte tokens typed BYTE.

Tensors are streamed to disk one at a time (the header is written first from their sizes), so
a several-hundred-MB model needs little memory. Files are written to a temporary name and
renamed, so a reader never sees a half-written model.

    make_llama_model(path, n_layer=2, n_embd=64, n_head=4, n_head_kv=2)   # 0.5 MB, 20 ms
    make_gemma3_model(path, n_layer=6, sliding_window=64)                 # sliding window
    make_llama_model(path, n_layer=12, n_embd=1024, n_head=16, n_head_kv=4, n_ff=2816,
                     n_vocab=32000, dtype="f16")   # 384 MiB, about 3.5 s on 2 cores
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import gguf
import numpy as np

DType = Literal["f32", "f16", "q8_0"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
_FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7}  # llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0
GENERATOR_VERSION = 1  # bump when the output of a given parameter set changes


def params_key(kind: str, params: dict[str, Any]) -> str:
    """A short stable hash of generator parameters, for cache file names."""
    blob = json.dumps({"kind": kind, "v": GENERATOR_VERSION, **params}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def spm_vocab(n_vocab: int, specials: tuple[str, ...] = ()) -> tuple[list[str], list[float],
                                                                      list[int]]:
    """Tokens, scores and token types of a synthetic SentencePiece vocabulary; ``specials``
    (e.g. ChatML's markers) take its last ids as control tokens, one token each."""
    if n_vocab < 300:
        raise ValueError("n_vocab must be at least 300 (3 special + 256 byte tokens + pieces)")
    tokens = ["<unk>", "<s>", "</s>"]
    types = [int(gguf.TokenType.UNKNOWN), int(gguf.TokenType.CONTROL), int(gguf.TokenType.CONTROL)]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [int(gguf.TokenType.BYTE)] * 256
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    chars = letters + letters.upper() + "0123456789.,!?'-:;()"
    pieces: list[str] = ["\u2581"]
    pieces += [c for c in chars] + ["\u2581" + c for c in chars]
    pieces += ["\u2581" + a + b for a in letters for b in letters]
    pieces += [a + b + c for a in letters for b in letters for c in letters]
    need = n_vocab - len(tokens)
    if need > len(pieces):
        pieces += [f"\u2581tok{i}" for i in range(need - len(pieces))]
    tokens += pieces[:need]
    types += [int(gguf.TokenType.NORMAL)] * need
    scores = [0.0] * 259 + [-float(i) for i in range(need)]
    if specials:
        tokens[-len(specials):] = list(specials)
        types[-len(specials):] = [int(gguf.TokenType.CONTROL)] * len(specials)
    return tokens, scores, types


class _Tensor:
    """A tensor to write: numpy shape (its last dimension is ggml's ne0), type, data maker."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: DType, make: Callable[[], Any]):
        self.name, self.shape, self.dtype, self.make = name, shape, dtype, make


def _tensor_plan(
    specs: list[tuple[str, tuple[int, ...], bool]],
    dtype: DType,
    seed: int,
    std: float = 0.02,
    keep_f32: frozenset[str] = frozenset(),
) -> Iterator[_Tensor]:
    """(name, numpy shape, is_norm) -> tensors; norms stay F32 (ones), matrices get ``dtype``
    except those named in ``keep_f32`` (random, F32: what the converter keeps unquantized)."""
    rng = np.random.default_rng(seed)
    for name, shape, is_norm in specs:
        stored: DType = "f32" if is_norm or name in keep_f32 else dtype
        yield _Tensor(name, shape, stored, _maker(rng, shape, is_norm, std))


def _maker(
    rng: np.random.Generator, shape: tuple[int, ...], is_norm: bool, std: float
) -> Callable[[], Any]:
    """Norm weights are ones; matrices small random normals (drawn when written)."""
    if is_norm:
        return lambda: np.ones(shape, dtype=np.float32)
    return lambda: rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def _encode(t: _Tensor, data: Any) -> Any:
    """The tensor's stored bytes as a numpy array (Q8_0 is quantized by gguf-py)."""
    if t.dtype == "f32":
        return np.ascontiguousarray(data, dtype=np.float32)
    if t.dtype == "f16":
        return np.ascontiguousarray(data, dtype=np.float16)
    return gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)


def _byte_shape(t: _Tensor) -> tuple[tuple[int, ...], Any, int]:
    """Shape, numpy dtype and byte count of the tensor's stored form, without its data."""
    n = int(np.prod(t.shape))
    if t.dtype == "f32":
        return t.shape, np.dtype(np.float32), n * 4
    if t.dtype == "f16":
        return t.shape, np.dtype(np.float16), n * 2
    if t.shape[-1] % 32:
        raise ValueError(f"{t.name}: q8_0 needs the last dimension to be a multiple of 32")
    byte_shape = (*t.shape[:-1], t.shape[-1] // 32 * 34)
    return byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape))


def _write(
    path: str | os.PathLike[str],
    arch: str,
    kv: Callable[[gguf.GGUFWriter], None],
    tensors: list[_Tensor],
) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(tmp, arch)
    try:
        kv(w)
        for t in tensors:
            shape, np_dtype, nbytes = _byte_shape(t)
            raw = gguf.GGMLQuantizationType.Q8_0 if t.dtype == "q8_0" else None
            w.add_tensor_info(t.name, shape, np_dtype, nbytes, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in tensors:
            w.write_tensor_data(_encode(t, t.make()))
        w.close()
        os.replace(tmp, out)
    finally:
        w.close()
        tmp.unlink(missing_ok=True)
    return out


def _common_kv(
    w: gguf.GGUFWriter, *, name: str, dtype: DType, n_vocab: int, chat_template: str | None,
    specials: tuple[str, ...] = (),
) -> None:
    w.add_type("model")
    w.add_name(name)
    w.add_file_type(_FILE_TYPE[dtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, scores, types = spm_vocab(n_vocab, specials)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)


def make_llama_model(
    path: str | os.PathLike[str],
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int | None = None,
    n_ff: int | None = None,
    n_vocab: int = 512,
    context_length: int = 2048,
    dtype: DType = "f32",
    seed: int = 0,
    chat_template: str | None = None,
    name: str = "modeld-test-llama",
    std: float = 0.02,
    specials: tuple[str, ...] = (),
) -> Path:
    """Write a random-weight ``llama`` model (GQA when ``n_head_kv < n_head``); matrices of
    std ``std`` (larger ones make later tokens depend more on earlier ones: vision tests);
    ``specials``: control tokens of its vocabulary (:func:`spm_vocab`)."""
    n_head_kv = n_head if n_head_kv is None else n_head_kv
    n_ff = 2 * n_embd if n_ff is None else n_ff
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    head_dim = n_embd // n_head
    kv_dim = head_dim * n_head_kv

    def kv(w: gguf.GGUFWriter) -> None:
        _common_kv(w, name=name, dtype=dtype, n_vocab=n_vocab, chat_template=chat_template,
                   specials=specials)
        w.add_context_length(context_length)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(n_vocab)

    specs: list[tuple[str, tuple[int, ...], bool]] = [
        ("token_embd.weight", (n_vocab, n_embd), False),
        ("output_norm.weight", (n_embd,), True),
        ("output.weight", (n_vocab, n_embd), False),
    ]
    for i in range(n_layer):
        b = f"blk.{i}."
        specs += [
            (b + "attn_norm.weight", (n_embd,), True),
            (b + "attn_q.weight", (n_embd, n_embd), False),
            (b + "attn_k.weight", (kv_dim, n_embd), False),
            (b + "attn_v.weight", (kv_dim, n_embd), False),
            (b + "attn_output.weight", (n_embd, n_embd), False),
            (b + "ffn_norm.weight", (n_embd,), True),
            (b + "ffn_gate.weight", (n_ff, n_embd), False),
            (b + "ffn_up.weight", (n_ff, n_embd), False),
            (b + "ffn_down.weight", (n_embd, n_ff), False),
        ]
    return _write(path, "llama", kv, list(_tensor_plan(specs, dtype, seed, std=std)))


def make_gemma3_model(
    path: str | os.PathLike[str],
    *,
    n_layer: int = 6,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 1,
    head_dim: int = 32,
    n_ff: int = 128,
    n_vocab: int = 512,
    context_length: int = 4096,
    sliding_window: int = 64,
    sliding_window_pattern: int | list[bool] | None = None,
    dtype: DType = "f32",
    seed: int = 0,
    chat_template: str | None = None,
    name: str = "modeld-test-gemma3",
) -> Path:
    """Write a random-weight ``gemma3`` model: sliding-window layers in llama.cpp's 5:1 pattern.

    Embeddings are tied (no ``output.weight``), as in real Gemma 3 files.
    ``sliding_window_pattern`` writes the optional pattern key (a period or per-layer flags).
    """
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim

    def kv(w: gguf.GGUFWriter) -> None:
        _common_kv(w, name=name, dtype=dtype, n_vocab=n_vocab, chat_template=chat_template)
        w.add_context_length(context_length)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_freq_base(1000000.0)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_sliding_window(sliding_window)
        if sliding_window_pattern is not None:
            w.add_sliding_window_pattern(sliding_window_pattern)

    specs: list[tuple[str, tuple[int, ...], bool]] = [
        ("token_embd.weight", (n_vocab, n_embd), False),
        ("output_norm.weight", (n_embd,), True),
    ]
    for i in range(n_layer):
        b = f"blk.{i}."
        specs += [
            (b + "attn_norm.weight", (n_embd,), True),
            (b + "attn_q.weight", (q_dim, n_embd), False),
            (b + "attn_k.weight", (kv_dim, n_embd), False),
            (b + "attn_v.weight", (kv_dim, n_embd), False),
            (b + "attn_q_norm.weight", (head_dim,), True),
            (b + "attn_k_norm.weight", (head_dim,), True),
            (b + "attn_output.weight", (n_embd, q_dim), False),
            (b + "post_attention_norm.weight", (n_embd,), True),
            (b + "ffn_norm.weight", (n_embd,), True),
            (b + "ffn_gate.weight", (n_ff, n_embd), False),
            (b + "ffn_up.weight", (n_ff, n_embd), False),
            (b + "ffn_down.weight", (n_embd, n_ff), False),
            (b + "post_ffw_norm.weight", (n_embd,), True),
        ]
    return _write(path, "gemma3", kv, list(_tensor_plan(specs, dtype, seed)))


def make_mlp_projector(
    path: str | os.PathLike[str],
    *,
    n_embd_text: int = 64,
    n_layer: int = 2,
    n_embd: int = 32,
    n_head: int = 2,
    n_ff: int = 64,
    n_hidden: int = 64,
    image_size: int = 32,
    patch_size: int = 8,
    seed: int = 0,
    std: float = 0.3,
    name: str = "modeld-test-mmproj",
) -> Path:
    """Write a random-weight image projector (``mmproj``) of llama.cpp's ``mlp`` type (LLaVA's):
    a ViT of ``n_layer`` blocks over ``patch_size`` patches of an ``image_size`` square, then
    two linear layers into the text model's ``n_embd_text``; an image is
    ``(image_size // patch_size) ** 2`` tokens (16 by default). ``clip.vision.feature_layer``
    names the last block so every block is used (LLaVA's default stops one short).

    Weights of std ``std``, not 0.02: the image's embeddings must be large enough that two
    images lead the text model to different replies."""
    if n_embd % n_head or image_size % patch_size:
        raise ValueError("n_embd must divide by n_head, image_size by patch_size")
    if n_ff == n_embd:
        raise ValueError("n_ff must differ from n_embd (clip.cpp would swap ffn up and down)")
    n_pos = (image_size // patch_size) ** 2

    def kv(w: gguf.GGUFWriter) -> None:
        w.add_type("mmproj")
        w.add_name(name)
        w.add_file_type(_FILE_TYPE["f32"])
        w.add_string("clip.projector_type", "mlp")
        w.add_bool("clip.has_vision_encoder", True)
        w.add_bool("clip.use_gelu", True)
        w.add_uint32("clip.vision.embedding_length", n_embd)
        w.add_uint32("clip.vision.feed_forward_length", n_ff)
        w.add_uint32("clip.vision.block_count", n_layer)
        w.add_uint32("clip.vision.projection_dim", n_embd_text)
        w.add_uint32("clip.vision.attention.head_count", n_head)
        w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
        w.add_uint32("clip.vision.image_size", image_size)
        w.add_uint32("clip.vision.patch_size", patch_size)
        w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
        w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
        w.add_array("clip.vision.feature_layer", [n_layer])

    specs: list[tuple[str, tuple[int, ...], bool]] = [
        ("v.patch_embd.weight", (n_embd, 3, patch_size, patch_size), False),
        ("v.patch_embd.bias", (n_embd,), False),
        ("v.position_embd.weight", (n_pos, n_embd), False),
        ("v.pre_ln.weight", (n_embd,), True),
        ("v.pre_ln.bias", (n_embd,), False),
    ]
    for i in range(n_layer):
        b = f"v.blk.{i}."
        specs += [(b + "ln1.weight", (n_embd,), True), (b + "ln1.bias", (n_embd,), False)]
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            specs += [(b + part + ".weight", (n_embd, n_embd), False),
                      (b + part + ".bias", (n_embd,), False)]  # fmt: skip
        specs += [
            (b + "ln2.weight", (n_embd,), True),
            (b + "ln2.bias", (n_embd,), False),
            (b + "ffn_up.weight", (n_ff, n_embd), False),
            (b + "ffn_up.bias", (n_ff,), False),
            (b + "ffn_down.weight", (n_embd, n_ff), False),
            (b + "ffn_down.bias", (n_embd,), False),
        ]
    specs += [
        ("mm.0.weight", (n_hidden, n_embd), False),
        ("mm.0.bias", (n_hidden,), False),
        ("mm.2.weight", (n_embd_text, n_hidden), False),
        ("mm.2.bias", (n_embd_text,), False),
    ]
    return _write(path, "clip", kv, list(_tensor_plan(specs, "f32", seed, std=std)))


BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BERT_WORDS = ("the", "of", "and", "to", "in", "is", "it", "cat", "dog", "sat", "on", "mat",
              "sky", "blue", "why", "paris", "capital", "france", "bread", "recipe")  # fmt: skip


def wpm_vocab(n_vocab: int) -> tuple[list[str], list[int]]:
    """Tokens and types of a synthetic WordPiece vocabulary in llama.cpp's form: a word-start
    piece carries a leading U+2581, a continuation piece none (convert_hf_to_gguf's mapping of
    BERT's ``##``), so any lower-case text of letters, digits and punctuation tokenizes."""
    tokens = list(BERT_SPECIALS)
    chars = "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-:;()"
    tokens += ["\u2581" + c for c in chars] + list(chars) + ["\u2581" + w for w in BERT_WORDS]
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    tokens += [a + b for a in letters for b in letters][: max(0, n_vocab - len(tokens))]
    assert len(set(tokens)) == len(tokens), "llama.cpp rejects a vocabulary with duplicates"
    if len(tokens) < n_vocab:
        raise ValueError(f"n_vocab must be at most {len(tokens)}")
    tokens = tokens[:n_vocab]
    types = [int(gguf.TokenType.CONTROL)] * len(BERT_SPECIALS)
    types += [int(gguf.TokenType.NORMAL)] * (n_vocab - len(BERT_SPECIALS))
    return tokens, types


def make_bert_reranker(
    path: str | os.PathLike[str],
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_ff: int = 128,
    n_vocab: int = 400,
    context_length: int = 512,
    dtype: DType = "f32",
    seed: int = 0,
    pooling_type: int = 4,
    name: str = "modeld-test-reranker",
) -> Path:
    """Write a random-weight ``bert`` cross-encoder with a classification head (``cls`` and
    ``cls.output``, one label) and rank pooling (``pooling_type`` 4), as convert_hf_to_gguf
    writes BERT rerankers; ``pooling_type`` 1 (mean) makes it a plain embedding model instead.
    A pair is ``[CLS] query [SEP] document [SEP]`` (add BOS and EOS, no extra SEP)."""
    if n_embd % n_head:
        raise ValueError("n_embd must divide by n_head")

    def kv(w: gguf.GGUFWriter) -> None:
        w.add_type("model")
        w.add_name(name)
        w.add_file_type(_FILE_TYPE[dtype])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        tokens, types = wpm_vocab(n_vocab)
        w.add_tokenizer_model("bert")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_type_count(2)
        w.add_pad_token_id(0)
        w.add_unk_token_id(1)
        w.add_bos_token_id(2)
        w.add_eos_token_id(3)
        w.add_sep_token_id(3)
        w.add_mask_token_id(4)
        w.add_add_bos_token(True)
        w.add_add_eos_token(True)
        w.add_add_sep_token(False)
        w.add_context_length(context_length)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_layer_norm_eps(1e-12)
        w.add_causal_attention(False)
        w.add_pooling_type(gguf.PoolingType(pooling_type))
        if pooling_type == 4:
            w.add_classifier_output_labels(["relevance"])

    specs: list[tuple[str, tuple[int, ...], bool]] = [
        ("token_embd.weight", (n_vocab, n_embd), False),
        ("token_types.weight", (2, n_embd), False),
        ("position_embd.weight", (context_length, n_embd), False),
        ("token_embd_norm.weight", (n_embd,), True),
        ("token_embd_norm.bias", (n_embd,), True),
    ]
    if pooling_type == 4:
        specs += [
            ("cls.weight", (n_embd, n_embd), False),
            ("cls.bias", (n_embd,), True),
            ("cls.output.weight", (1, n_embd), False),
            ("cls.output.bias", (1,), True),
        ]
    for i in range(n_layer):
        b = f"blk.{i}."
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            specs += [
                (b + part + ".weight", (n_embd, n_embd), False),
                (b + part + ".bias", (n_embd,), True),
            ]
        specs += [
            (b + "attn_output_norm.weight", (n_embd,), True),
            (b + "attn_output_norm.bias", (n_embd,), True),
            (b + "ffn_up.weight", (n_ff, n_embd), False),
            (b + "ffn_up.bias", (n_ff,), True),
            (b + "ffn_down.weight", (n_embd, n_ff), False),
            (b + "ffn_down.bias", (n_embd,), True),
            (b + "layer_output_norm.weight", (n_embd,), True),
            (b + "layer_output_norm.bias", (n_embd,), True),
        ]
    # weights of std 0.5, not 0.02: with tiny ones every pair would score the same to 1e-5;
    # token_types stays F32 as convert_hf_to_gguf keeps it (llama.cpp adds its row unconverted)
    plan = _tensor_plan(specs, dtype, seed, std=0.5, keep_f32=frozenset({"token_types.weight"}))
    return _write(path, "bert", kv, list(plan))


# Presets used by the conftest fixtures (kind "llama" unless the name says otherwise).
TINY: dict[str, Any] = dict(
    n_layer=2, n_embd=64, n_head=4, n_ff=128, n_vocab=512, context_length=2048, dtype="f32"
)
TINY_CHAT: dict[str, Any] = dict(TINY, chat_template=CHATML_TEMPLATE)
GQA: dict[str, Any] = dict(
    n_layer=3, n_embd=128, n_head=8, n_head_kv=2, n_ff=256, n_vocab=600,
    context_length=8192, dtype="f16",
)  # fmt: skip
Q8: dict[str, Any] = dict(TINY, dtype="q8_0")
SWA: dict[str, Any] = dict(  # kind "gemma3"
    n_layer=7, n_embd=64, n_head=4, n_head_kv=1, head_dim=32, n_ff=128, n_vocab=512,
    context_length=4096, sliding_window=64, dtype="f32",
)  # fmt: skip

RERANKER: dict[str, Any] = dict(n_layer=2, n_embd=64, n_head=4, n_ff=128, n_vocab=400)  # "bert"
#: TINY_CHAT whose attention weighs earlier positions enough that an image changes the reply
VISION_CHAT: dict[str, Any] = dict(TINY_CHAT, std=0.4)
#: kind "mmproj": a projector for TINY/TINY_CHAT/VISION_CHAT (n_embd 64); an image is 16 tokens
TINY_MMPROJ: dict[str, Any] = dict(n_embd_text=64, n_layer=2, n_embd=32, n_head=2, n_ff=64,
                                   image_size=32, patch_size=8)  # fmt: skip


def mmproj_tokens(params: dict[str, Any]) -> int:
    """Tokens one image takes with a projector made from ``params`` (``mlp``: one a patch)."""
    return int((params.get("image_size", 32) // params.get("patch_size", 8)) ** 2)

MAKERS: dict[str, Callable[..., Path]] = {
    "llama": make_llama_model, "gemma3": make_gemma3_model, "bert": make_bert_reranker,
    "mmproj": make_mlp_projector,
}  # fmt: skip


def cached_model(cache_dir: str | os.PathLike[str], kind: str, **params: Any) -> Path:
    """Build (once) a model into ``cache_dir``, named by a hash of its parameters."""
    path = Path(cache_dir) / f"{kind}-{params_key(kind, params)}.gguf"
    if not path.exists():
        MAKERS[kind](path, **params)
    return path


# --- Raw encoder: hand-made (possibly malformed) GGUF bytes for reader tests ---------------

GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL = 4, 5, 6, 7
GGUF_STRING, GGUF_ARRAY, GGUF_UINT64 = 8, 9, 10
_PACK = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
         11: "<q", 12: "<d"}  # fmt: skip


def encode_string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def encode_value(vtype: int, value: Any, elem_type: int | None = None) -> bytes:
    """The bytes of one value of GGUF type ``vtype`` (arrays need ``elem_type``)."""
    if vtype == GGUF_STRING:
        return encode_string(value)
    if vtype == GGUF_ARRAY:
        assert elem_type is not None
        body = b"".join(encode_value(elem_type, v) for v in value)
        return struct.pack("<IQ", elem_type, len(value)) + body
    return struct.pack(_PACK[vtype], value)


def encode_kv(key: str, vtype: int, value: Any, elem_type: int | None = None) -> bytes:
    return encode_string(key) + struct.pack("<I", vtype) + encode_value(vtype, value, elem_type)


def _guess(value: Any) -> tuple[int, Any, int | None]:
    """(value type, value, element type) for a Python value: int -> u32, list -> array."""
    if isinstance(value, bool):
        return GGUF_BOOL, value, None
    if isinstance(value, int):
        return GGUF_UINT32, value, None
    if isinstance(value, float):
        return GGUF_FLOAT32, value, None
    if isinstance(value, str):
        return GGUF_STRING, value, None
    return GGUF_ARRAY, value, _guess(value[0])[0]


def encode_tensor_info(name: str, ne: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    """One tensor-table entry; ``ne`` is in ggml order (fastest-varying dimension first)."""
    dims = b"".join(struct.pack("<Q", d) for d in ne)
    return (
        encode_string(name)
        + struct.pack("<I", len(ne))
        + dims
        + struct.pack("<IQ", ggml_type, offset)
    )


def raw_gguf(
    meta: dict[str, Any] | None = None,
    *,
    kv_blobs: list[bytes] | None = None,
    tensors: Sequence[tuple[str, tuple[int, ...], int, int]] | None = None,
    tensor_data: int = 0,
    version: int = 3,
    magic: bytes = b"GGUF",
    alignment: int = 32,
) -> bytes:
    """A complete GGUF file: metadata from a dict (types guessed: int -> u32, list -> array),
    plus raw ``kv_blobs``, a tensor table of (name, ne, ggml_type, offset) and
    ``tensor_data`` zero bytes after the aligned data offset."""
    blobs = [encode_kv(k, *_guess(v)) for k, v in (meta or {}).items()]
    blobs += kv_blobs or []
    infos = [encode_tensor_info(*t) for t in tensors or []]
    head = magic + struct.pack("<IQQ", version, len(infos), len(blobs))
    body = head + b"".join(blobs) + b"".join(infos)
    pad = -len(body) % alignment
    return body + b"\0" * (pad + tensor_data)

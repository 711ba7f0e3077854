"""KV cache geometry as llama.cpp sizes it: cells per layer kind, bytes per cell, cache types.

Separate from :mod:`.memory` (the whole-runner estimate) because the layer layout across RPC
workers (:mod:`modeld.rpc.layout`), the per-card placement (:mod:`.placement`), the sizing of
parallel sequences (:mod:`modeld.sizing`) and the settings' and wire's accepted cache types
need these rules without the estimator's fitted constants. Pure arithmetic on
:class:`ModelInfo`, no I/O.
"""

from __future__ import annotations

from modeld.model.modelinfo import ModelInfo

CELL_PAD = 256  # llama.cpp pads KV cells to 256 with flash attention (and always for SWA)

#: bytes per element of the KV cache types llama.cpp accepts (block bytes / block elements)
KV_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
    "iq4_nl": 18 / 32,
}

#: the KV cache types modeld offers (Ollama's OLLAMA_KV_CACHE_TYPE, llama-server's -ctk/-ctv);
#: a quantized V cache needs flash attention, which the runner always uses
KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")

#: architectures llama.cpp builds without a KV cache (``llama_model::create_memory``: encoders
#: and diffusion models attend within the micro-batch only)
NO_KV_ARCHITECTURES = frozenset({
    "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2",
    "jina-bert-v3", "eurobert", "gemma-embedding", "wavtokenizer-dec", "dream", "llada",
    "llada-moe", "rnd1", "clef",
})  # fmt: skip


def pad_cells(n: int, pad: int = CELL_PAD) -> int:
    """``n`` rounded up to a multiple of ``pad`` (at least one pad)."""
    return max(pad, -(-int(n) // pad) * pad)


def kv_type_bytes(type_name: str) -> float:
    """Bytes per element of a KV cache type; ValueError names the accepted types."""
    try:
        return KV_TYPE_BYTES[type_name.lower()]
    except KeyError:
        accepted = ", ".join(sorted(KV_TYPE_BYTES))
        raise ValueError(f"unknown KV cache type {type_name!r} (accepted: {accepted})") from None


def _layer_bytes_per_cell(info: ModelInfo, layer: int, bk: float, bv: float) -> float:
    n_kv = info.head_count_kv[layer] if layer < len(info.head_count_kv) else info.head_count
    return n_kv * (info.key_length * bk + info.value_length * bv)


def kv_cells(
    info: ModelInfo,
    n_ctx: int,
    *,
    swa_full: bool = False,
    n_ubatch: int = 512,
    n_seq: int = 1,
    unified: bool = True,
) -> tuple[int, int]:
    """(cells of full-attention layers, cells of sliding-window layers) as llama.cpp sizes them.

    ``unified`` False (the runner's parallel sequences): one KV stream of ``n_ctx / n_seq``
    cells per sequence, and each stream's sliding layers keep ``n_swa + n_ubatch`` cells.
    """
    full = pad_cells(n_ctx)
    if not any(info.sliding_layers) or not info.sliding_window:
        return full, 0
    if swa_full:
        return full, full
    if not unified and n_seq > 1:
        per_seq = pad_cells(n_ctx // n_seq)
        return full, n_seq * pad_cells(min(per_seq, info.sliding_window + n_ubatch))
    return full, pad_cells(min(full, info.sliding_window * n_seq + n_ubatch))


def kv_bytes_per_token(info: ModelInfo, *, type_k: str = "f16", type_v: str = "f16") -> float:
    """KV bytes one token costs summed over *all* layers (as if none used a sliding window)."""
    bk, bv = kv_type_bytes(type_k), kv_type_bytes(type_v)
    return sum(_layer_bytes_per_cell(info, i, bk, bv) for i in range(info.block_count))


def kv_cache_bytes(
    info: ModelInfo,
    n_ctx: int,
    *,
    type_k: str = "f16",
    type_v: str = "f16",
    swa_full: bool = False,
    n_ubatch: int = 512,
    n_seq: int = 1,
    unified: bool = True,
) -> int:
    """The KV cache llama.cpp allocates for ``n_ctx`` (sliding layers sized by their window)."""
    bk, bv = kv_type_bytes(type_k), kv_type_bytes(type_v)
    full, swa = kv_cells(
        info, n_ctx, swa_full=swa_full, n_ubatch=n_ubatch, n_seq=n_seq, unified=unified
    )
    total = 0.0
    for i in range(info.block_count):
        total += layer_kv_bytes(info, i, (full, swa), bk, bv)
    return int(total)


def layer_kv_bytes(
    info: ModelInfo, layer: int, cells: tuple[int, int], bk: float = 2.0, bv: float = 2.0
) -> float:
    """The KV cache of one layer, given :func:`kv_cells`' (full, sliding) cells: a sliding-window
    layer gets the sliding count when there is one (``bk``/``bv``: bytes per K/V element)."""
    full, swa = cells
    sliding = layer < len(info.sliding_layers) and info.sliding_layers[layer] and swa > 0
    return _layer_bytes_per_cell(info, layer, bk, bv) * (swa if sliding else full)


def has_kv_cache(info: ModelInfo) -> bool:
    """Whether llama.cpp gives the model a KV cache (not encoders such as BERT rerankers)."""
    return info.architecture not in NO_KV_ARCHITECTURES


def context_cells(n_ctx: int, n_seq: int, unified: bool) -> tuple[int, bool]:
    """A generate context's cells and whether they are one pool: ``n_seq`` sequences of
    ``n_ctx`` cells each, or with ``unified`` (and more than one sequence) one pool of
    ``n_ctx`` cells they share (kv_unified)."""
    n = max(1, n_seq)
    unified = unified and n > 1
    return (n_ctx if unified else n_ctx * n), unified

"""What llama.cpp knows that a GGUF header does not say, as plain tables and pure functions.

ggml type sizes (to size tensors), llama_ftype names (``general.file_type`` -> ``Q4_K_M``),
and per-architecture rules: which layers use a sliding window when the file does not say, and
which architectures keep a recurrent state. Kept apart from the binary reader in
:mod:`modeld.model.gguffile` because these tables follow llama.cpp releases, not the file format.
"""

from __future__ import annotations

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
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_1_SOME_F16", 7: "Q8_0", 8: "Q5_0",
    9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S",
    15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS",
    21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S",
    27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    33: "Q4_0_4_4", 34: "Q4_0_4_8", 35: "Q4_0_8_8", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 1024: "GUESSED",
}  # fmt: skip

# Per-architecture sliding-window defaults, mirroring hparams.set_swa_pattern() calls in
# llama.cpp's model loader: arch -> (period, dense_first, default window, needs window key).
# With period n, layer il slides iff il % n < n - 1 (dense_first: iff il % n != 0); n == 0
# means every layer slides. "needs window key": llama.cpp enables SWA only when the file
# sets {arch}.attention.sliding_window > 0.
SWA_DEFAULTS: dict[str, tuple[int, bool, int | None, bool]] = {
    "gemma2": (2, False, 4096, False), "gemma3": (6, False, None, False),
    "gemma3n": (5, False, None, False), "gemma-embedding": (6, False, None, False),
    "cohere2": (4, False, None, False), "gpt-oss": (2, False, None, False),
    "llama4": (4, False, 8192, False),  # chunked attention, 8192-token chunks
    "olmo2": (4, False, None, True), "exaone4": (4, False, None, True),
    "exaone-moe": (4, False, None, True), "afmoe": (4, False, None, True),
    "smallthinker": (4, True, None, True), "modern-bert": (3, False, None, True),
}  # fmt: skip
# Architectures llama.cpp runs with a recurrent state (pure or hybrid with attention).
RECURRENT = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID = frozenset(
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
    return FILE_TYPES.get(file_type, f"UNKNOWN_{file_type}")


def sliding_layers(
    arch: str, n_layer: int, window: int | None, pattern: int | tuple[bool, ...] | None
) -> tuple[int | None, tuple[bool, ...], str | None]:
    """(window, per-layer flags, note) as llama.cpp would set them for ``arch``.

    ``window`` and ``pattern`` are the file's ``{arch}.attention.sliding_window`` and
    ``..._pattern`` (a period or per-layer flags), None where absent. The window is None when
    no layer slides; the note says when a default or an ignored key decided the result.
    """
    none: tuple[int | None, tuple[bool, ...], str | None] = (None, (False,) * n_layer, None)
    default = SWA_DEFAULTS.get(arch)
    eff = window if window is not None else (default[2] if default else None)
    if isinstance(pattern, tuple):  # explicit per-layer flags
        return (eff, pattern, None) if eff and any(pattern) else none
    if not eff:
        return none
    if default is None and pattern is None:
        ignored = (
            f"{arch}.attention.sliding_window={window} is not used by llama.cpp; full attention"
        )
        return None, none[1], ignored
    if default is not None and default[3] and not window:
        return none
    period = pattern if pattern is not None else (default[0] if default else 0)
    dense_first = default[1] if default else False
    if period == 0:
        flags = (True,) * n_layer
    elif dense_first:
        flags = tuple(il % period != 0 for il in range(n_layer))
    else:
        flags = tuple(il % period < period - 1 for il in range(n_layer))
    note = None
    if pattern is None:
        note = f"sliding-window layers follow llama.cpp's default for {arch} (period {period})"
    return (eff, flags, note) if any(flags) else none


def recurrent_note(arch: str) -> str | None:
    """A note when ``arch`` keeps a recurrent state (its memory is then estimated roughly)."""
    if arch in RECURRENT:
        return f"approximate: {arch} is a recurrent architecture; its state size is estimated"
    if arch in HYBRID:
        kind = "hybrid recurrent/attention"
        return f"approximate: {arch} is a {kind} architecture; its state size is estimated"
    return None

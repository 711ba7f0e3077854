"""Memory estimate for one loaded model: pure arithmetic on :class:`ModelInfo`, no I/O.

The estimate predicts what a runner process holds *on top of its baseline* (the RSS after
``import llama_cpp``) once the model is loaded and has processed a full micro-batch of prompt:
that is the figure the daemon must budget for, and the one ``bench/calibrate.py`` measures
(``/proc/<pid>/smaps_rollup`` of a real llama-cpp-python 0.3.36 process). Components:

* **weights** — with mmap, the file pages llama.cpp maps and pre-faults (``MAP_POPULATE``):
  the span from the first to the last tensor kept in the mapped buffer. On x86-64 with AVX2
  (and on ARM) ggml's CPU backend *repacks* some quantized matrices (Q4_0, Q4_K, Q2_K, IQ4_NL)
  into an interleaved layout in an anonymous buffer; the file pages of those tensors stay
  resident too when they sit inside the mapped span, so they count twice. Without mmap every
  weight is anonymous.
* **kv_cache** — per layer and cell ``n_head_kv(layer) × (key_length × bytes(type_k) +
  value_length × bytes(type_v))``; full-attention layers get ``n_ctx`` cells, sliding-window
  layers ``min(n_ctx, n_swa × n_seq + n_ubatch)`` (with ``swa_full=False``), both padded to 256
  (llama.cpp ``llama_kv_cache_iswa``; the rules live in :mod:`.kvcache`). llama.cpp zeroes
  the buffer, so it is all resident. Encoders (BERT embedders and rerankers) have none: they
  attend within one micro-batch.
* **compute** — the part of ggml's compute buffer a real batch touches. llama.cpp *reserves*
  far more (514 MiB for gemma-3-270m, dominated by logits for 512 outputs that a generation
  never produces), but reserved-and-untouched pages cost nothing. Fitted on measurements:
  ``n_ubatch × 4 B × (2.4·n_embd + 3.45·n_ff + 1.3·n_head·key_length)`` plus the attention
  masks for a full context (``cells × n_ubatch × 2 B`` per mask kind with flash attention).
  Embed mode follows modeld's runner: a model with an LM head (a decoder without pooling) is
  decoded ``EMBED_CHUNK`` tokens at a time, so the touched pages are one chunk's activations
  plus its full-vocabulary logits (llama.cpp computes logits for every token it embeds);
  a pooled encoder embeds an input as one whole-context micro-batch, whose live activations
  are ``n_ubatch × 4 B × max(n_ff + 3·n_embd, 5.5·n_embd)`` plus its own f16 mask.
* **output** — the logits row(s) (``n_vocab × 4 B`` per sequence). An embedding context is
  created by llama-cpp-python for ``min(n_batch, 256)`` sequences, and llama.cpp reserves and
  touches logits + embeddings for that many rows at load (257 MiB for a 262k vocabulary);
  pooled encoders: embeddings for every token of the micro-batch.
* **overhead** — vocabulary tables and the sampler's candidate array (about 176 B per token:
  43 MiB for a 262k vocabulary), graph metadata, and the native code pages touched by a load.
* **prompt_cache** — generate mode only: the runner's prompt-state snapshots and context
  checkpoints (:mod:`.runner.promptcache`), bounded by the ``prompt_cache_mib`` setting (auto:
  a share of the memory budget, :func:`modeld.config.prompt_cache_auto`) and counted at that
  bound (they fill up as prompts are served). Kept out of ``total`` (the calibrated figure:
  ``bench/calibrate.py`` measures runners with the cache off); the daemon adds it to what it
  reserves for a load, like the runner baseline.
* **runner_baseline** — the runner process itself (Python + llama_cpp imported); *not* part of
  :attr:`MemoryEstimate.total`, because the daemon measures its spare runner and adds that.

Measured error on this machine class is within ±10% (see docs/benchmarks.md). GPU offload,
recurrent models, pooled embedding models other than BERT and non-flash attention are
modelled but not calibrated: ``approximate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from modeld.model.kvcache import (
    has_kv_cache,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_cells,
    kv_type_bytes,
    pad_cells,
)
from modeld.model.modelinfo import ModelInfo, TensorInfo

MiB = 1 << 20

#: ggml types the CPU backend repacks on x86-64 AVX2+/ARM (ggml-cpu/repack.cpp) when the row
#: count is a multiple of 8. Checked on the 0.3.36 build here: Q4_K repacks; Q5_0, Q6_K, Q8_0 not.
REPACK_TYPES = frozenset({"Q4_0", "Q4_K", "Q2_K", "IQ4_NL"})

# Fitted constants (bench/calibrate.py, llama-cpp-python 0.3.36, x86-64 AVX-512, 2 threads).
VOCAB_BYTES_PER_TOKEN = 176  # llama_vocab token tables + sampler candidates (12 B) + cache
CONTEXT_OVERHEAD = int(3.5 * MiB)  # llama_context/sched metadata, threadpool, small heaps
CODE_PAGES = 4 * MiB  # file-backed pages of libllama/libggml first touched by load + decode
COMPUTE_CONSTANT = int(0.4 * MiB)
COMPUTE_PER_EMBD = 2.4  # f32 activations of width n_embd live at once, per ubatch token
COMPUTE_PER_FF = 3.45  # ... of width n_ff (gate, up, activation, product)
COMPUTE_PER_Q = 1.3  # ... of width n_head × key_length (Q, attention output)
#: a cache-less encoder's micro-batch (BERT): the FFN input, its n_ff-wide product and the
#: residual stream live at once, or ~5.5 n_embd-wide tensors in attention when n_ff is small;
#: fitted on llama.cpp's compute-buffer reserve for n_embd 384-1024, n_ff 2-8 x n_embd
ENCODER_PER_EMBD = 3.0
ENCODER_PER_EMBD_ATTN = 5.5
MASK_BYTES_FA = 2  # f16 KQ mask per (cell, token) with flash attention
MASK_BYTES_NO_FA = 4  # f32 mask without it
EMBED_ACTS_SHARE = 0.5  # embed mode: share of activations not overlapped by the logits tensor
#: Tokens per decode when the runner embeds with a model that has no pooling (a decoder with an
#: LM head): llama.cpp computes full-vocabulary logits for every token of an embedding batch,
#: so ``modeld.runner`` decodes in chunks of this many tokens (the KV cache carries the prefix)
#: to bound that buffer. runner/embedding.py uses this constant: the estimate cannot drift from it.
EMBED_CHUNK = 64
EMBED_N_BATCH = 512  # the runner's n_batch (= n_ubatch) for chunked embedding, capped at n_ctx
#: Tokens per micro-batch of a generate runner (n_batch is 512 too). Each KV stream's
#: sliding-window layers keep ``n_swa + n_ubatch`` cells and the compute buffer grows with it:
#: at 256, gemma-3-270m with 4 sequences of 4096 cells held 23.5 MiB less after a 512-token
#: prompt, prompts as fast (793 vs 787 tokens/s), but a 777-token prompt then outgrew its
#: stream's sliding cells (768) and its greedy reply batched beside 6 others differed from the
#: solo one (tests/test_batch_invariance.py): kept at 512 until that case is understood.
GENERATE_N_UBATCH = 512

#: Images a vision runner keeps the embeddings of beside the one it encodes, and the bytes of
#: decoded images (RGB) it keeps for its next requests: one 1920x1080 screenshot, or many small
#: images (runner/vision.py). projector.memory_bytes charges both.
KEPT_IMAGES = 4
KEPT_BITMAP_BYTES = 8 * 1024 * 1024
#: llama.cpp's LLAMA_MAX_SEQ; llama-cpp-python's ``embedding=True`` sets
#: ``n_seq_max = min(n_batch, this)`` and a unified KV cache
MAX_PARALLEL_SEQUENCES = 256
#: a runner process after ``import llama_cpp`` (measured 40 MiB RSS) plus its ZeroMQ socket
RUNNER_BASELINE = 48 * MiB

Mode = Literal["generate", "embed", "rerank"]
MODES: tuple[Mode, ...] = ("generate", "embed", "rerank")


def mode_of(value: str) -> Mode:
    """A request's or key's mode as the typed :data:`Mode` (anything but a known mode is an
    error, never a silent "generate")."""
    for mode in MODES:
        if value == mode:
            return mode
    raise ValueError(f"unknown mode {value!r} (one of {', '.join(MODES)})")


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted resident bytes of one model in its runner, by component.

    ``total`` is what the model itself adds to a runner (RAM: file-backed + anonymous), the
    figure bench/calibrate.py measures; ``prompt_cache`` (the runner's prompt snapshots, filled
    over time up to a configured bound) and ``runner_baseline`` are separate and added by the
    caller: :attr:`need` is what the daemon reserves for a load.
    """

    n_ctx: int
    weights: int  # weights_file + weights_anon (RAM only)
    weights_file: int  # resident mmap'd file pages
    weights_anon: int  # repacked copies, or all weights without mmap
    kv_cache: int
    compute: int
    output: int
    overhead: int  # vocab tables, graph metadata, native code pages
    runner_baseline: int
    vram: int = 0  # bytes on the GPU (offloaded layers), not part of ``total``
    prompt_cache: int = 0  # the runner's prompt snapshots at their bound; not in ``total``
    kv_cells: int = 0  # cells of full-attention layers
    swa_cells: int = 0  # cells of sliding-window layers (0 when the model has none)
    approximate: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def total(self) -> int:
        """RAM the model adds to a runner: every component except the runner baseline."""
        return self.weights + self.kv_cache + self.compute + self.output + self.overhead

    @property
    def total_bytes(self) -> int:
        """Alias of :attr:`total` (the name the daemon uses)."""
        return self.total

    @property
    def file_backed(self) -> int:
        """The part that shows up as file-backed RSS (mmap'd weights, code pages)."""
        return self.weights_file + min(CODE_PAGES, self.overhead)

    @property
    def anonymous(self) -> int:
        """The part that shows up as anonymous RSS."""
        return self.total - self.file_backed

    @property
    def with_baseline(self) -> int:
        """A whole runner process holding this model."""
        return self.total + self.runner_baseline

    def to_dict(self) -> dict[str, object]:
        """JSON-safe form for ``show``/``ps`` and the benchmark files."""
        return {
            "n_ctx": self.n_ctx,
            "weights": self.weights,
            "weights_file": self.weights_file,
            "weights_anon": self.weights_anon,
            "kv_cache": self.kv_cache,
            "compute": self.compute,
            "output": self.output,
            "overhead": self.overhead,
            "prompt_cache": self.prompt_cache,
            "runner_baseline": self.runner_baseline,
            "vram": self.vram,
            "total": self.total,
            "kv_cells": self.kv_cells,
            "swa_cells": self.swa_cells,
            "approximate": self.approximate,
            "notes": list(self.notes),
        }


def _rows(t: TensorInfo) -> int:
    """ne[1] of a GGUF tensor (shapes are stored ne0 first)."""
    return t.shape[1] if len(t.shape) > 1 else 1


def is_repacked(t: TensorInfo) -> bool:
    """Whether ggml's CPU backend copies this weight into its repack (anonymous) buffer."""
    if t.type_name not in REPACK_TYPES or len(t.shape) != 2 or _rows(t) % 8:
        return False
    # get_rows tensors (token embeddings) and norms stay in the mapped buffer
    return t.name.endswith(".weight") and not t.name.startswith(("token_embd", "position_embd"))


def weight_bytes(info: ModelInfo, *, mmap: bool = True, repack: bool = True) -> tuple[int, int]:
    """(file-backed, anonymous) resident bytes of the weights."""
    tensors = info.tensors
    if not tensors:
        return (info.tensor_bytes, 0) if mmap else (0, info.tensor_bytes)
    packed = [t for t in tensors if repack and is_repacked(t)]
    anon = sum(t.n_bytes for t in packed)
    if not mmap:
        return 0, info.tensor_bytes
    ids = {id(t) for t in packed}
    kept = [t for t in tensors if id(t) not in ids]
    if not kept:
        return 0, anon
    # llama.cpp maps [first kept tensor, last kept tensor] and unmaps the rest of the file
    span = max(t.offset + t.n_bytes for t in kept) - min(t.offset for t in kept)
    return span, anon


def compute_bytes(
    info: ModelInfo,
    n_ctx: int,
    *,
    flash_attn: bool = True,
    swa_full: bool = False,
    n_ubatch: int = 512,
    n_seq: int = 1,
    logits_rows: int = 1,
    unified: bool = True,
) -> int:
    """Compute-buffer pages a full micro-batch touches (not what llama.cpp reserves).

    ``logits_rows`` > 1 adds the logits tensor for that many tokens (an embedding batch makes
    every token an output, so a model with an LM head computes logits for all of them).
    """
    ub = max(1, min(n_ubatch, pad_cells(n_ctx)))
    q_width = info.head_count * info.key_length
    ff = info.feed_forward_length or 4 * info.embedding_length
    width = COMPUTE_PER_EMBD * info.embedding_length + COMPUTE_PER_FF * ff + COMPUTE_PER_Q * q_width
    acts = ub * 4 * width
    full, swa = kv_cells(info, n_ctx, swa_full=swa_full, n_ubatch=ub, n_seq=n_seq, unified=unified)
    mask_cells = full + swa
    if flash_attn:
        attn = mask_cells * ub * MASK_BYTES_FA
    else:  # mask plus the KQ matrix and its softmax, per head
        attn = mask_cells * ub * MASK_BYTES_NO_FA + 2 * info.head_count * full * ub * 4
    if logits_rows > 1:
        # the logits tensor comes last and partly reuses the freed activation pages
        logits = min(logits_rows, ub) * info.vocab_size * 4
        return int(COMPUTE_CONSTANT + attn + logits + EMBED_ACTS_SHARE * acts)
    return int(COMPUTE_CONSTANT + acts + attn)


def encoder_compute_bytes(info: ModelInfo, n_ubatch: int) -> int:
    """The compute buffer of a cache-less encoder for one ``n_ubatch``-token micro-batch: the
    widest set of live activations plus the micro-batch's own f16 attention mask."""
    e = info.embedding_length
    ff = info.feed_forward_length or 4 * e
    width = max(ff + ENCODER_PER_EMBD * e, ENCODER_PER_EMBD_ATTN * e)
    return int(n_ubatch * 4 * width + n_ubatch * pad_cells(n_ubatch, 64) * MASK_BYTES_FA)


def embed_seq_max(n_batch: int) -> int:
    """Sequences an embedding context is created for (llama-cpp-python: min(n_batch, 256)).

    It matters: llama.cpp reserves (and touches) the output buffer for that many rows at load
    (``n_seq × (n_vocab + n_embd) × 4 B``: 257 MiB for gemma-3-270m), and with a unified KV
    cache sliding-window layers get ``n_swa × n_seq + n_ubatch`` cells, i.e. the whole context.
    """
    return max(1, min(n_batch, MAX_PARALLEL_SEQUENCES))


def has_lm_head(info: ModelInfo) -> bool:
    """Whether the graph ends in vocabulary logits (generative models; not BERT-like encoders)."""
    return not info.is_embedding_model


def estimate(
    info: ModelInfo,
    n_ctx: int,
    *,
    mode: Mode = "generate",
    embedding: bool | None = None,
    flash_attn: bool = True,
    swa_full: bool = False,
    type_k: str = "f16",
    type_v: str = "f16",
    n_batch: int | None = None,
    n_ubatch: int | None = None,
    n_seq: int = 1,
    mmap: bool = True,
    gpu_layers: int = 0,
    repack: bool = True,
    prompt_cache: int = 0,
    kv_unified: bool = False,
) -> MemoryEstimate:
    """Predict the resident memory of ``info`` loaded with ``n_ctx`` (rounded up to 256).

    ``embedding=True`` is a synonym of ``mode="embed"``. Batch sizes default to how modeld's
    runner loads: 512/512 to generate; to embed with a model that has an LM head,
    ``min(512, n_ctx)`` for both, with ``EMBED_CHUNK``-token decodes (runner/embedding.py);
    a pooled encoder gets the whole context in one micro-batch (it needs every token of an
    input in one batch) and is flagged approximate. ``repack=False`` models a CPU
    without AVX2/NEON (no repacked copies). ``gpu_layers`` moves that share of weights and KV
    to :attr:`MemoryEstimate.vram` (not calibrated). ``prompt_cache``: bytes of the runner's
    prompt-state cache (the daemon passes its ``prompt_cache_mib``; ignored in embed mode).
    ``kv_unified``: the ``n_seq`` sequences share one KV stream of ``n_ctx`` cells.
    """
    if n_ctx <= 0:
        raise ValueError(f"n_ctx must be positive, got {n_ctx}")
    if embedding is not None:
        mode = "embed" if embedding else "generate"
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not flash_attn and kv_type_bytes(type_v) < 2:
        raise ValueError("a quantized V cache needs flash attention")
    n_ctx = pad_cells(n_ctx)
    # a reranker runs as a pooled encoder (rank pooling): the embed path's memory exactly
    embed = mode in ("embed", "rerank")
    chunked = embed and has_lm_head(info)  # the runner decodes EMBED_CHUNK tokens at a time
    pooled = embed and not chunked  # one input in one whole-context micro-batch
    default_batch = n_ctx if pooled else min(EMBED_N_BATCH if embed else 512, n_ctx)
    n_batch = n_batch if n_batch is not None else default_batch
    n_ubatch = n_ubatch if n_ubatch is not None else (n_batch if embed else GENERATE_N_UBATCH)
    n_ubatch = max(1, min(n_ubatch, n_batch, n_ctx))
    if embed:  # llama-cpp-python: n_seq_max = min(n_batch, 256), one unified KV cache
        n_seq = max(n_seq, embed_seq_max(n_batch))
    # the batch whose compute pages get touched: a chunk when chunked, else a full micro-batch
    run_ubatch = min(EMBED_CHUNK, n_ubatch) if chunked else n_ubatch
    logits_rows = run_ubatch if chunked else 1
    notes: list[str] = list(info.notes)
    approximate = False

    w_file, w_anon = weight_bytes(info, mmap=mmap, repack=repack)
    # the runner's parallel sequences have a KV stream each (unless it shares one: kv_unified);
    # llama-cpp-python's embedding context keeps its n_seq_max sequences in one unified cache
    unified = embed or kv_unified
    if has_kv_cache(info):
        kv = kv_cache_bytes(
            info, n_ctx, type_k=type_k, type_v=type_v, swa_full=swa_full, n_ubatch=n_ubatch,
            n_seq=n_seq, unified=unified,
        )  # fmt: skip
        full_cells, swa_cells = kv_cells(
            info, n_ctx, swa_full=swa_full, n_ubatch=n_ubatch, n_seq=n_seq, unified=unified
        )
        compute = compute_bytes(
            info,
            n_ctx,
            flash_attn=flash_attn,
            swa_full=swa_full,
            n_ubatch=run_ubatch,
            n_seq=n_seq,
            logits_rows=logits_rows,
            unified=unified,
        )
    else:  # an encoder attends within its micro-batch: no cells, a mask of ubatch x ubatch
        kv, full_cells, swa_cells = 0, 0, 0
        compute = encoder_compute_bytes(info, run_ubatch)
    if chunked:  # logits + embeddings for n_seq_max rows, reserved and touched at load
        output = max(n_seq, run_ubatch) * 4 * (info.vocab_size + info.embedding_length)
    elif pooled:  # embeddings for every token of the micro-batch
        output = n_ubatch * 4 * info.embedding_length
    else:
        output = info.vocab_size * 4 * max(1, n_seq)
    if pooled and info.architecture != "bert":
        approximate = True
        notes.append("approximate: pooled embedding models other than BERT are not calibrated")
    overhead = CONTEXT_OVERHEAD + VOCAB_BYTES_PER_TOKEN * info.vocab_size + CODE_PAGES

    if info.recurrent:
        approximate = True
        notes.append("approximate: recurrent/hybrid layers keep a fixed state, not a KV cache")
    if not flash_attn:
        approximate = True
        notes.append("approximate: without flash attention the KQ matrix grows with n_ctx")
    vram = 0
    if gpu_layers > 0:
        approximate = True
        share = min(gpu_layers, info.block_count + 1) / (info.block_count + 1)
        on_gpu_w = int((w_file + w_anon) * share)
        on_gpu_kv = int(kv * share)
        vram = on_gpu_w + on_gpu_kv + compute
        w_file -= int(w_file * share)
        w_anon -= int(w_anon * share)
        kv -= on_gpu_kv
        notes.append(f"approximate: {gpu_layers} layers offloaded to the GPU (not calibrated)")

    return MemoryEstimate(
        n_ctx=n_ctx,
        weights=w_file + w_anon,
        weights_file=w_file,
        weights_anon=w_anon,
        kv_cache=kv,
        compute=compute,
        output=output,
        overhead=overhead,
        runner_baseline=RUNNER_BASELINE,
        vram=vram,
        prompt_cache=0 if embed else max(0, int(prompt_cache)),
        kv_cells=full_cells,
        swa_cells=swa_cells,
        approximate=approximate,
        notes=tuple(notes),
    )


def naive_estimate(info: ModelInfo, n_ctx: int) -> int:
    """The common rule of thumb, for comparison: (file + n_ctx × KV per token) × 1.1."""
    return int((info.file_size + n_ctx * kv_bytes_per_token(info)) * 1.1)

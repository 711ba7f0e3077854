"""Where llama.cpp puts a model on RPC workers, and the largest n_ctx whose every share fits.

Pure (no native imports): it mirrors ``llama_model_base::load_tensors`` of llama.cpp
(llama-cpp-python 0.3.36) for ``n_gpu_layers = -1``: the ``n_layer + 1`` layers (the repeating
blocks, then the output layer) are cut at the cumulative shares of each device's weight
(its free memory, or ``tensor_split``), in float32, with ``upper_bound``; the input
embedding stays on the CPU. A layer's KV cache lives on its layer's device; each device
reserves a compute buffer, the output layer's device also the logits of one micro-batch.

Weights and KV cache are exact (llama.cpp reports them to 0.01 MiB); the compute buffers are
an estimate fitted to llama.cpp's reports on two generated llama models, one and two workers,
n_ctx 512-2048 (tests/test_rpc_plan.py): from 1 % low to 29 % high (a tiny model on one
worker, where fixed costs dominate).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from modeld.errors import InsufficientMemoryError, format_bytes
from modeld.model import kvcache, memory
from modeld.model.modelinfo import ModelInfo

#: micro-batch of a generate-mode runner (llamaopen.open_llama: min(this, n_batch))
N_UBATCH = memory.GENERATE_N_UBATCH
#: activation floats per token of a micro-batch: per feed-forward row and per embedding row
_ACT_PER_FF = 2
_ACT_PER_EMBD = 10
#: compute-buffer bytes per (cell x micro-batch token): the f16 mask on one device; split
#: over several, each device's graph piece also holds its own copies (measured: 8)
_MASK_BYTES_ONE = 2
_MASK_BYTES_SPLIT = 8
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_OUTPUT = ("output.weight", "output_norm.weight", "output_norm.bias", "output.bias")


def _f32(x: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def layer_devices(n_layer: int, weights: Sequence[float]) -> list[int]:
    """The device index of each of the ``n_layer + 1`` layers (the last is the output layer),
    as llama.cpp cuts them at the cumulative float32 shares of ``weights``."""
    if not weights or sum(weights) <= 0:
        raise ValueError("no device with memory to split the layers over")
    points, acc = [], _f32(0.0)
    for w in weights:
        acc = _f32(acc + _f32(float(w)))
        points.append(acc)
    points = [_f32(p / acc) for p in points]
    n = n_layer + 1
    out = []
    for il in range(n):
        x = _f32(il / n)
        dev = next((i for i, p in enumerate(points) if p > x), len(points))
        out.append(min(dev, len(points) - 1))
    return out


@dataclass(frozen=True)
class Share:
    """What one device gets of a model at one n_ctx."""

    endpoint: str
    layers: int
    model_bytes: int
    kv_bytes: int
    compute_bytes: int
    memory_bytes: int  # what modeld may plan with on it: its free memory, capped

    @property
    def total(self) -> int:
        return self.model_bytes + self.kv_bytes + self.compute_bytes

    @property
    def fits(self) -> bool:
        return self.total <= self.memory_bytes


def _weights_by_layer(info: ModelInfo) -> dict[int, int]:
    out: dict[int, int] = {}
    n = info.block_count
    names = {t.name for t in info.tensors}
    for t in info.tensors:
        m = _BLOCK.match(t.name)
        if m:
            out[int(m[1])] = out.get(int(m[1]), 0) + t.n_bytes
        elif t.name in _OUTPUT:
            out[n] = out.get(n, 0) + t.n_bytes
        elif t.name == "token_embd.weight" and "output.weight" not in names:
            out[n] = out.get(n, 0) + t.n_bytes  # tied: llama.cpp duplicates it as the output
    return out


def plan(
    info: ModelInfo,
    n_ctx: int,
    endpoints: Sequence[str],
    memory_bytes: Sequence[int],
    split: Sequence[float] | None = None,
    parallel: int = 1,
    kv_unified: bool = False,
) -> list[Share]:
    """Each worker's share of ``info`` at ``n_ctx`` cells per sequence (``parallel``
    sequences, as the runner creates them), or with ``kv_unified`` one pool of ``n_ctx``
    cells they share. ``split``: the weights llama.cpp cuts the layers by (each device's
    reported free memory, or the ``tensor_split`` passed); default ``memory_bytes``."""
    n = info.block_count
    devs = layer_devices(n, split if split is not None else [float(m) for m in memory_bytes])
    by_layer = _weights_by_layer(info)
    seqs = max(1, parallel)
    cells, pooled = kvcache.context_cells(n_ctx, seqs, kv_unified)
    full, swa = kvcache.kv_cells(
        info, cells, n_ubatch=N_UBATCH, n_seq=seqs, unified=pooled or seqs == 1
    )
    streams = 1 if pooled else seqs
    ub = min(N_UBATCH, full)
    ff = info.feed_forward_length or 4 * info.embedding_length
    acts = ub * 4 * (_ACT_PER_FF * ff + _ACT_PER_EMBD * info.embedding_length)
    logits = ub * 4 * info.vocab_size
    used = len(set(devs))
    # each sequence has a KV stream of its own (a pool is one): a micro-batch attends within
    # one stream
    mask = ub * (full + swa) // streams * (_MASK_BYTES_ONE if used == 1 else _MASK_BYTES_SPLIT)
    out = []
    for d, ep in enumerate(endpoints):
        layers = [il for il in range(n + 1) if devs[il] == d]
        kv = 0.0
        for il in layers:
            if il < n and kvcache.has_kv_cache(info):
                kv += kvcache.layer_kv_bytes(info, il, (full, swa))
        compute = 0
        if layers and used == 1:  # one graph: the logits reuse the freed activations
            compute = max(acts, logits) + mask
        elif layers:
            compute = acts + mask if n not in layers else logits + acts // 2 + mask
        out.append(Share(
            ep, len(layers), sum(by_layer.get(il, 0) for il in layers), int(kv), compute,
            int(memory_bytes[d]),
        ))  # fmt: skip
    return out


def largest_fitting(
    info: ModelInfo,
    endpoints: Sequence[str],
    memory_bytes: Sequence[int],
    upper: int,
    split: Sequence[float] | None = None,
    parallel: int = 1,
    kv_unified: bool = False,
) -> int:
    """The largest n_ctx (a multiple of 256, at most ``upper``) whose every share fits; 0 when
    not even 256 does."""
    best, lo, hi = 0, 1, upper // 256
    while lo <= hi:
        mid = (lo + hi) // 2
        shares = plan(info, mid * 256, endpoints, memory_bytes, split, parallel, kv_unified)
        if all(s.fits for s in shares):
            best, lo = mid * 256, mid + 1
        else:
            hi = mid - 1
    return best


def fit(
    info: ModelInfo,
    name: str,
    n_ctx: int,
    floor: int | None,
    endpoints: Sequence[str],
    memory_bytes: Sequence[int],
    split: Sequence[float] | None = None,
    parallel: int = 1,
    kv_unified: bool = False,
) -> tuple[int, list[Share]]:
    """(n_ctx, shares): ``n_ctx`` when every worker's share fits, else the largest that does
    down to ``floor`` (None: ``n_ctx`` was asked for, it is not lowered); otherwise
    InsufficientMemoryError naming the worker whose share does not fit, with the numbers."""
    shares = plan(info, n_ctx, endpoints, memory_bytes, split, parallel, kv_unified)
    if all(s.fits for s in shares):
        return n_ctx, shares
    if floor is not None:
        best = largest_fitting(info, endpoints, memory_bytes, n_ctx, split, parallel,
                               kv_unified)
        if best >= floor:
            return best, plan(info, best, endpoints, memory_bytes, split, parallel, kv_unified)
    at = n_ctx if floor is None else floor
    worst = next(s for s in plan(info, at, endpoints, memory_bytes, split, parallel, kv_unified)
                 if not s.fits)  # fmt: skip
    raise InsufficientMemoryError(
        f"rpc worker {worst.endpoint} has {format_bytes(worst.memory_bytes)} for modeld but its "
        f"share of {name} at n_ctx {at} is {format_bytes(worst.total)} ({worst.layers} layers: "
        f"weights {format_bytes(worst.model_bytes)}, KV cache {format_bytes(worst.kv_bytes)}, "
        f"compute {format_bytes(worst.compute_bytes)})",
        hint="add workers, free memory on that worker, ask for a smaller context (--ctx), or "
        "raise rpc_worker_memory if it caps the worker",
        details={"endpoint": worst.endpoint, "n_ctx": at, "need_bytes": worst.total,
                 "memory_bytes": worst.memory_bytes, "layers": worst.layers},
    )  # fmt: skip

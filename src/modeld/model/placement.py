"""Where a model goes: its KV cache type, and how many of its layers sit on each GPU (pure).

The options come from the load (``--gpu-layers``, ``num_gpu``), else the model's own
``[model_options.NAME]`` table, else the settings. Layers: as many as fit each card's room,
the rest in RAM with their KV cache; several cards share the layers in proportion to what each
can take. A process that uses a card pays :data:`CUDA_PROCESS_BYTES` there before any weight.
A card's room is what the cache leaves a load there: the card's total less what other
processes hold and a margin (:func:`vram_budget`), less what every resident or loading model
accounts, plus what idle models it may evict (``CachePolicy.vram_available_for``).

llama.cpp's ``--fit`` (common/fit.cpp) dry-runs allocations of one model: at the full
training context with every layer on the cards; when that leaves less than 1 GiB on a card it
shrinks an automatic context toward ``--fit-ctx`` (4096) by linear interpolation, and only
then moves layers off the cards (back to front, by false position; MoE experts first). It
fits against what is free now, ignores host RAM and other models, and the context it gives up
is gone for the process's life. modeld keeps the preference (layers before context:
:func:`modeld.sizing.keep_on_cards`, down to ``max(ctx_floor, FIT_CTX)``) but plans RAM and
every card in one step against every resident model (evicting idle ones per tier, counting
loads in flight), by its calibrated estimate instead of probing loads, and the context it gives
up is only a start: it grows on demand when a prompt needs it, and the placement is planned
again then (with fewer layers if that is what fits, rather than a refusal).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modeld.model import kvcache, memory
from modeld.model.memory import MemoryEstimate, MiB
from modeld.model.modelinfo import ModelInfo

#: VRAM a CUDA process holds before any weight (context, cuBLAS handles, kernels): measured on
#: an H100 (driver 580, CUDA 13.0, llama-cpp-python 0.3.36): NVML per-process bytes of a fully
#: offloaded 1.1B f16 model minus modeld's estimate of it, 4k-32k contexts, 1-4 sequences:
#: 716-736 MB (issue 34; DESIGN.md section 12).
CUDA_PROCESS_BYTES = 720 * MiB
#: Kept free on each card beside the estimate (llama.cpp's --fit keeps 1 GiB; modeld counts
#: the CUDA context itself, so half of that covers the estimate's error).
VRAM_MARGIN = 512 * MiB
#: The context ``sizing`` may shrink toward to keep every layer on the cards (--fit-ctx).
FIT_CTX = 4096


@dataclass(frozen=True)
class Gpu:
    """One card as the planner sees it: its index, name and the bytes a load may use there."""

    index: int
    name: str
    total: int
    free: int  # NVML free: what other processes (other models' runners too) hold is out


@dataclass(frozen=True)
class Placement:
    """Layers on the cards and what each card holds (``layers`` counts the output layer, as
    llama.cpp's ``n_gpu_layers``: a model of N blocks has N + 1)."""

    gpu_layers: int
    n_layers: int
    vram: tuple[int, ...] = ()  # bytes per card (the CUDA context included)
    tensor_split: tuple[float, ...] = ()  # llama.cpp's split between the cards (empty: one)
    reason: str = "CPU only"
    cards: int = 0  # cards it was planned against (0: no GPU)
    asked: int | None = None  # the layers asked (at most ``n_layers``; None: as many as fit)

    def wants_reload(self, gpu_layers: int | None) -> bool:
        """Whether a request's ``gpu_layers`` (-1: as many as fit; None: says nothing) asks
        for another placement than this one: never without a card, never when it has what
        is asked (so a count that does not fit is not reloaded for again and again)."""
        if gpu_layers is None or not self.cards:
            return False
        want = None if gpu_layers < 0 else min(gpu_layers, self.n_layers)
        return want != self.asked and (want is None or want != self.gpu_layers)

    @property
    def on_gpu(self) -> bool:
        return self.gpu_layers > 0


def option(job_value: Any, name: str, key: str, settings: Any) -> Any:
    """A load option: the load's own value, else ``[model_options.NAME]``'s, else the setting."""
    if job_value is not None:
        return job_value
    own: Mapping[str, Any] = settings.model_options.get(name, {})
    if key in own:
        return own[key]
    return getattr(settings, key)


@dataclass(frozen=True)
class Where:
    """What a load is planned with: its KV cache type, the cards and its GPU layers."""

    kv_type: str = "f16"
    gpus: tuple[Gpu, ...] = ()
    gpu_layers: int | None = 0  # None: as many as fit
    margin: int = VRAM_MARGIN  # kept free on each card (0: ``free`` is already a budget)


#: elements per block of the quantized KV types: a head's K and V rows must hold whole blocks
KV_BLOCK = 32


def check_kv_type(info: ModelInfo, kv_type: str) -> None:
    """InvalidRequestError (before any load) when llama.cpp would refuse the KV cache type:
    a quantized cache needs head sizes that are multiples of its block (32)."""
    from modeld.errors import InvalidRequestError

    if kv_type == "f16" or (info.key_length % KV_BLOCK == 0 and info.value_length % KV_BLOCK == 0):
        return
    raise InvalidRequestError(
        f"a {kv_type} KV cache needs head sizes that are multiples of {KV_BLOCK}; this model's "
        f"are {info.key_length} (K) and {info.value_length} (V)",
        hint="load it with kv_cache_type f16 (--kv-cache-type f16, or per model in "
        "[model_options.NAME])",
        details={"kv_cache_type": kv_type, "key_length": info.key_length,
                 "value_length": info.value_length},
    )  # fmt: skip


def processor(gpu_layers: int, n_layers: int) -> str:
    """``ollama ps``'s PROCESSOR, by layers: ``100% GPU``, ``100% CPU``, ``35%/65% CPU/GPU``."""
    if gpu_layers <= 0 or n_layers <= 0:
        return "100% CPU"
    gpu = min(100, round(100 * gpu_layers / n_layers))
    if gpu >= 100:
        return "100% GPU"
    return f"{100 - gpu}%/{gpu}% CPU/GPU"


def planned(
    info: ModelInfo, n_ctx: int, where: Where, *, mode: str = "generate", parallel: int = 1,
    prompt_cache: int = 0, unified: bool = False,
) -> tuple[MemoryEstimate, Placement]:
    """The estimate (RAM in ``total``, the cards in ``vram``) and the placement of a load."""
    place_ = place(info, n_ctx, where.gpus, where.gpu_layers, mode=mode, parallel=parallel,
                   kv_type=where.kv_type, margin=where.margin, unified=unified)  # fmt: skip
    est = with_layers(info, n_ctx, place_.gpu_layers, mode=mode, parallel=parallel,
                      kv_type=where.kv_type, prompt_cache=prompt_cache,
                      unified=unified)  # fmt: skip
    return est, place_


def with_layers(
    info: ModelInfo, n_ctx: int, layers: int, *, mode: str = "generate", parallel: int = 1,
    kv_type: str = "f16", prompt_cache: int = 0, unified: bool = False,
) -> MemoryEstimate:
    """The estimate of ``parallel`` sequences of ``n_ctx`` with ``layers`` on the GPUs: those
    layers' weights and KV cache and the compute buffer in ``vram`` (plus the CUDA context),
    the rest in RAM. The input embedding stays in RAM (llama.cpp keeps it on the CPU).
    ``unified``: the sequences share one pool of ``n_ctx`` cells (kv_unified)."""
    n = max(1, parallel)
    cells, unified = kvcache.context_cells(n_ctx, n, unified)
    est = memory.estimate(info, cells, mode=memory.mode_of(mode), n_seq=n,
                          prompt_cache=prompt_cache, gpu_layers=layers, type_k=kv_type,
                          type_v=kv_type, kv_unified=unified)  # fmt: skip
    if layers <= 0:
        return est
    embd = sum(t.n_bytes for t in info.tensors if t.name == "token_embd.weight")
    share = min(layers, info.block_count + 1) / (info.block_count + 1)
    moved = int(embd * share)  # what memory.estimate's even share put on the card
    return dataclasses.replace(
        est, weights=est.weights + moved, weights_file=est.weights_file + moved,
        vram=max(0, est.vram - moved) + CUDA_PROCESS_BYTES,
    )  # fmt: skip


@dataclass(frozen=True)
class Card:
    """One card as NVML reads it: its memory and, when NVML says, each process's bytes."""

    index: int
    name: str
    total: int
    used: int
    processes: Mapping[int, int] | None = None  # pid -> bytes; None: NVML did not say


def vram_budget(card: Card, own_pids: Collection[int], own_bytes: int,
                margin: int = VRAM_MARGIN) -> int:  # fmt: skip
    """What modeld's models may hold on ``card``: its total less what other processes hold
    and the margin. Other processes: NVML's used bytes less those of modeld's runners
    (``own_pids``), or, when NVML names no processes, less ``own_bytes`` (what modeld
    accounts there). Budgeting from the total, not from NVML's free bytes, is what lets the
    cache charge a load that has not allocated yet, and count an idle model's VRAM as room."""
    if card.processes is not None:
        others = card.used - sum(b for pid, b in card.processes.items() if pid in own_pids)
    else:
        others = card.used - own_bytes
    return max(0, card.total - max(0, others) - margin)


def layer_map(p: Placement, names: Sequence[str]) -> dict[str, Any]:
    """Which layers go where, as llama.cpp assigns them: the first blocks stay in RAM and the
    last ``gpu_layers`` (the output layer counted last, as block ``n_layers - 1``) go to the
    cards in order, split by ``tensor_split``: ``{"RAM": "0-9", "CUDA0": "10-22"}``."""
    first = p.n_layers - p.gpu_layers
    out: dict[str, Any] = {"RAM": _span(0, first)} if first > 0 else {}
    if p.gpu_layers <= 0:
        return out
    split = p.tensor_split or tuple(1.0 if i == 0 else 0.0 for i in range(max(1, len(names))))
    start, acc = first, 0.0
    for i, share in enumerate(split):
        acc += share
        end = p.n_layers if i == len(split) - 1 else first + round(p.gpu_layers * acc)
        if end > start and i < len(names):
            out[names[i]] = _span(start, end)
        start = max(start, end)
    return out


def describe(p: Placement, kv_type: str) -> dict[str, Any]:
    """Where a load's layers go, for ``show`` and ``ps``: the processor split as ``ollama ps``
    says it, which layers sit in RAM and on each card, the bytes each card holds, why."""
    names = [f"CUDA{i}" for i in range(len(p.vram))]
    return {"backend": "CUDA" if p.gpu_layers > 0 else "CPU",
            "processor": processor(p.gpu_layers, p.n_layers), "gpu_layers": p.gpu_layers,
            "n_layers": p.n_layers, "layers": layer_map(p, names), "vram_bytes": list(p.vram),
            "reason": p.reason, "kv_cache_type": kv_type}  # fmt: skip


def split_like(total: int, planned: Sequence[int]) -> tuple[int, ...]:
    """A runner's measured VRAM (NVML's sum over the cards) split as the plan split it; the
    daemon reads each card's own figure before the next plan (``Admission.read_cards``)."""
    whole = sum(planned)
    if whole <= 0:
        return tuple(0 for _ in planned)
    return tuple(total * p // whole for p in planned)


def _span(a: int, b: int) -> str:
    return str(a) if b - a == 1 else f"{a}-{b - 1}"


def budgets(gpus: Sequence[Gpu], margin: int = VRAM_MARGIN) -> list[int]:
    """What a load may put on each card: its free bytes less the margin."""
    return [max(0, g.free - margin) for g in gpus]


def place(
    info: ModelInfo, n_ctx: int, gpus: Sequence[Gpu], asked: int | None, *,
    mode: str = "generate", parallel: int = 1, kv_type: str = "f16",
    margin: int = VRAM_MARGIN, unified: bool = False,
) -> Placement:
    """How many layers go on the cards: ``asked`` (None: as many as fit), never more than fit
    the cards' budgets; split between the cards by their budgets."""
    n_layers = info.block_count + 1
    want = n_layers if asked is None else min(asked, n_layers)
    none = functools.partial(Placement, 0, n_layers, cards=len(gpus),
                             asked=None if asked is None else want)  # fmt: skip
    if not gpus or asked == 0 or info.block_count <= 0:
        return none(reason="no GPU" if not gpus else "gpu_layers 0: CPU only")
    room = budgets(gpus, margin)
    usable = [i for i, r in enumerate(room) if r > CUDA_PROCESS_BYTES]
    if not usable:
        return none(reason="no card has room for the CUDA context and a layer")

    def fits(layers: int) -> tuple[int, ...] | None:
        est = with_layers(info, n_ctx, layers, mode=mode, parallel=parallel, kv_type=kv_type,
                          unified=unified)
        per_card_fixed = CUDA_PROCESS_BYTES + est.compute
        movable = est.vram - per_card_fixed  # weights + KV of the layers, split by room
        spare = [room[i] - per_card_fixed for i in usable]
        if min(spare) < 0 and len(usable) == 1:
            return None
        cards = [i for i, s in zip(usable, spare, strict=True) if s > 0]
        total = sum(room[i] - per_card_fixed for i in cards)
        if not cards or movable > total:
            return None
        out = [0] * len(gpus)
        for i in cards:
            out[i] = per_card_fixed + int(movable * (room[i] - per_card_fixed) / total)
        return tuple(out)

    lo, hi, best = 1, want, None
    while lo <= hi:  # more layers only ever need more VRAM: bisect the largest that fits
        mid = (lo + hi) // 2
        got = fits(mid)
        if got is not None:
            best, lo = (mid, got), mid + 1
        else:
            hi = mid - 1
    if best is None:
        return none(reason="not one layer fits the free VRAM")
    layers, vram = best
    used = [i for i, b in enumerate(vram) if b > 0]
    split = tuple(round(vram[i] / sum(vram), 4) for i in range(len(gpus))) if len(used) > 1 else ()
    if layers == n_layers:
        why = "every layer fits the free VRAM"
    elif asked is not None and layers == asked:
        why = f"{asked} layers asked"
    else:
        why = f"{layers} of {n_layers} layers fit the free VRAM; the rest in RAM"
    return Placement(layers, n_layers, vram, split, why, len(gpus),
                     None if asked is None else want)  # fmt: skip

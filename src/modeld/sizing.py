"""The daemon's bridge to the memory and context policies: budget, n_ctx and bytes to reserve.

Kept apart from the scheduler so the rules for "how big may this load be" sit in one place:
the budget is ``min(memory_fraction x usable RAM, memory_cap)``; a load reserves the model's
estimate plus the runner process baseline and, in generate mode, its prompt cache
(``prompt_cache_mib``); n_ctx is planned against what is free plus every
evictable entry (:meth:`CachePolicy.budget_available_for`).

With ``parallel`` N a generate-mode runner decodes N sequences together and each has n_ctx
cells of its own: the KV cache and buffers are those of N x n_ctx cells in N sequences. The
automatic N is :data:`AUTO_PARALLEL` (llama-server's 4); an explicit N is lowered
to the largest one whose N contexts of at least ``ctx_floor`` fit. With ``kv_unified`` the N
sequences share one pool of n_ctx cells (any one may fill it): the context is sized as for
one sequence and N is never lowered for memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from modeld.cache.policy import CachePolicy, ModelKey
from modeld.config import PROMPT_CACHE_MIB, Settings
from modeld.errors import (
    ContextExceededError,
    InsufficientMemoryError,
    InvalidModelError,
    ModelNotFoundError,
    format_bytes,
)
from modeld.model import kvcache, memory
from modeld.model.ctx import STEP, largest_fitting, round_up
from modeld.model.memory import MemoryEstimate
from modeld.model.modelinfo import MODE_VERBS, ModelInfo
from modeld.model.placement import FIT_CTX, Placement, Where, check_kv_type, place, planned

#: ``parallel`` when neither the load nor the settings say: llama-server's automatic slot count.
AUTO_PARALLEL = 4
AUTO_REASON = "automatic (4, as llama-server)"


@dataclass(frozen=True)
class Sizing:
    """What a load of one model will use."""

    n_ctx: int
    estimate_bytes: int  # the model in the runner (weights, KV, buffers)
    need_bytes: int  # estimate + prompt cache + runner baseline: what the cache reserves
    reason: str
    parallel: int = 1  # sequences decoded together, each with n_ctx cells
    parallel_reason: str = "one sequence"
    kv_unified: bool = False  # the sequences share one pool of n_ctx cells instead
    kv_type: str = "f16"
    placement: Placement = field(default_factory=lambda: Placement(0, 0))  # layers on GPUs
    vram_bytes: int = 0  # what the GPUs hold (the CUDA context included)
    prompt_cache_bytes: int = 0  # the runner's prompt snapshots and checkpoints (in need_bytes)


def default_threads() -> int:
    """Runner threads when the config does not say: from the CPU affinity and cgroup quota."""
    from modeld.model import probe

    return max(1, int(probe.cpu_threads()))


def memory_budget(settings: Settings) -> tuple[int, int]:
    """(budget bytes, usable bytes): the fraction of usable RAM, capped by memory_cap."""
    from modeld.model import probe

    usable = int(probe.usable_memory().ram_bytes)
    budget = int(usable * settings.memory_fraction)
    if settings.memory_cap_bytes is not None:
        budget = min(budget, int(settings.memory_cap_bytes))
    return max(0, budget), usable


def prompt_cache_bytes(mode: str, settings: Settings | None,
                       budget_bytes: int | None = None) -> int:
    """The prompt-state cache (snapshots and context checkpoints) a runner of this mode keeps
    in a memory budget of ``budget_bytes`` (None: this machine's, from ``settings``); generate
    mode only."""
    if mode != "generate":
        return 0
    if settings is None:
        return PROMPT_CACHE_MIB << 20
    if budget_bytes is None and settings.prompt_cache_mib is None:
        budget_bytes = memory_budget(settings)[0]
    return settings.prompt_cache_bytes(budget_bytes or 0)


def estimate_n(
    info: ModelInfo,
    n_ctx: int,
    *,
    mode: str = "generate",
    parallel: int = 1,
    prompt_cache: int = 0,
    offload: bool = False,
    kv_type: str = "f16",
    where: Where | None = None,
    unified: bool = False,
) -> MemoryEstimate:
    """The estimate of ``parallel`` sequences of ``n_ctx`` cells each (one context of
    ``n_ctx x parallel`` cells with ``n_seq`` = ``parallel``, as the runner creates it), or
    with ``unified`` sharing one pool of ``n_ctx`` cells.
    ``offload``: every layer on other devices (RPC workers): their weights and KV cache move
    to ``vram``, out of the local ``total``, except the input embedding, which llama.cpp keeps
    on the CPU (read into memory: the runner loads without mmap then). ``kv_type``: the KV
    cache type; ``where`` (not with ``offload``): the cards and GPU layers, planned by
    :func:`modeld.model.placement.place` (its ``kv_type`` wins)."""
    import dataclasses

    if where is not None and not offload:
        return planned(info, n_ctx, where, mode=mode, parallel=parallel,
                       prompt_cache=prompt_cache, unified=unified)[0]  # fmt: skip
    kind = memory.mode_of(mode)
    n = max(1, parallel)
    cells, unified = kvcache.context_cells(n_ctx, n, unified)
    layers = info.block_count + 1 if offload else 0
    est = memory.estimate(
        info, cells, mode=kind, n_seq=n, prompt_cache=prompt_cache,
        gpu_layers=layers, type_k=kv_type, type_v=kv_type, kv_unified=unified,
    )
    if not offload:
        return est
    local = sum(t.n_bytes for t in info.tensors if t.name == "token_embd.weight")
    return dataclasses.replace(
        est, weights=est.weights + local, weights_anon=est.weights_anon + local,
        vram=max(0, est.vram - local),
    )  # fmt: skip


def _estimate(
    info: ModelInfo, n_ctx: int, mode: str, parallel: int = 1, offload: bool = False,
    where: Where | None = None, unified: bool = False,
) -> int:
    return int(estimate_n(info, n_ctx, mode=mode, parallel=parallel, offload=offload,
                          where=where, unified=unified).total)  # fmt: skip


def breakdown(
    info: ModelInfo,
    n_ctx: int,
    mode: str,
    settings: Settings | None = None,
    parallel: int = 1,
    offload: bool = False,
    where: Where | None = None,
    unified: bool = False,
) -> dict[str, object]:
    """The estimate's components (weights, KV cache, compute, prompt cache, ...) for ``show``;
    without ``settings`` the prompt cache is counted at its default size. ``offload``: on
    RPC workers (their share is ``vram``)."""
    cache = prompt_cache_bytes(mode, settings)
    return estimate_n(
        info, n_ctx, mode=mode, parallel=parallel, prompt_cache=cache, offload=offload,
        where=where, unified=unified,
    ).to_dict()


def _choose(
    info: ModelInfo,
    mode: str,
    budget: int,
    requested: int | None,
    settings: Settings,
    parallel: int = 1,
    offload: bool = False,
    where: Where | None = None,
    unified: bool = False,
) -> tuple[int, int, str]:
    """(n_ctx, estimate, reason) within ``budget`` model bytes, or InsufficientMemoryError."""
    import functools

    from modeld.model import ctx

    choice = ctx.choose_context(
        info,
        budget,
        floor=settings.ctx_floor,
        ceiling=settings.ctx_ceiling,
        requested=requested,
        estimate_fn=functools.partial(estimate_n, offload=offload, where=where, unified=unified),
        mode=memory.mode_of(mode),
        parallel=parallel,
    )
    return int(choice.n_ctx), int(choice.estimate.total), str(choice.reason)


def parallel_wanted(mode: str, asked: int | None, settings: Settings) -> tuple[int, str]:
    """(N, where it came from) before memory is considered: the load's value, the setting, or
    :data:`AUTO_PARALLEL`; always 1 to embed or rerank (one request at a time, its inputs
    batched)."""
    if mode == "embed":
        return 1, "embedding: one request at a time"
    if mode == "rerank":
        return 1, "reranking: one request at a time"
    if asked is not None:
        return asked, "requested by the load"
    if settings.parallel is not None:
        return settings.parallel, "the parallel setting"
    return AUTO_PARALLEL, AUTO_REASON


def _fitting_parallel(
    info: ModelInfo,
    mode: str,
    budget: int,
    requested: int | None,
    settings: Settings,
    want: int,
    offload: bool = False,
    where: Where | None = None,
    unified: bool = False,
) -> tuple[int, int, int, str]:
    """(N, n_ctx, estimate, ctx reason) for the largest N <= ``want`` whose N contexts fit
    ``budget``; InsufficientMemoryError (of N = 1) when not even one does. ``unified``: the N
    share one pool, sized whatever N is: N is ``want``."""
    if unified and want > 1:
        return (want, *_choose(info, mode, budget, requested, settings, want, offload, where,
                               unified=True))  # fmt: skip
    for n in range(want, 1, -1):
        try:
            return (n, *_choose(info, mode, budget, requested, settings, n, offload, where))
        except InsufficientMemoryError:
            continue
    return (1, *_choose(info, mode, budget, requested, settings, 1, offload, where))


def check_mode(info: ModelInfo, mode: str, path: str) -> None:
    """InvalidModelError (before any load) when ``mode`` does not suit the model: a rerank
    request needs a reranker, and a reranker is used for nothing else."""
    why = info.mode_mismatch(mode)
    if why is None:
        return
    name = os.path.basename(path)
    hint = (
        "use 'modeld rerank MODEL QUERY DOC...' (or /v1/rerank) with this model"
        if info.is_reranker
        else "rerank with a reranker GGUF (a cross-encoder such as bge-reranker); this model "
        "works with " + ("'modeld embed'" if info.is_embedding_model else "'modeld run'")
    )
    raise InvalidModelError(f"{name} cannot {MODE_VERBS.get(mode, mode)}: {why}", hint=hint)


def size_for(
    info: ModelInfo,
    mode: str,
    cache: CachePolicy,
    key: ModelKey,
    baseline: int,
    requested: int | None,
    settings: Settings,
    parallel: int | None = None,
    offload: bool = False,
    where: Where | None = None,
    projector: int = 0,
    unified: bool = False,
) -> Sizing:
    """The n_ctx (per sequence), ``parallel`` and reservation for loading ``key`` now.

    Planned against free + evictable memory; when even the smallest context does not fit there
    but would fit once busy models finish, the smallest is returned (the cache plan then says
    "wait"). Raises InsufficientMemoryError when it can never fit. ``parallel``: the load's
    own value (None: the setting, else automatic); lowered until its contexts fit.
    ``offload``: the layers go to RPC workers; only what stays local is charged here.
    ``where``: the KV cache type and the cards: layers on them are charged to them, not to
    the RAM budget (:mod:`modeld.model.placement`). ``projector``: the bytes of an image projector
    loaded beside the model (:func:`modeld.projector.memory_bytes`), reserved with it.
    ``unified``: the sequences share one pool of n_ctx cells (kv_unified).
    """
    check_mode(info, mode, key.path)
    if where is not None:
        check_kv_type(info, where.kv_type)
    # reserved beside the model's estimate
    prompts = prompt_cache_bytes(mode, settings, cache.budget_bytes)
    extra = baseline + prompts + projector
    available = cache.budget_available_for(key) - extra
    want, source = parallel_wanted(mode, parallel, settings)
    unified = unified and want > 1
    try:
        n, n_ctx, est, reason = _fitting_parallel(
            info, mode, available, requested, settings, want, offload, where, unified
        )
    except InsufficientMemoryError:
        pinned = sum(e.accounted_bytes for e in cache.entries() if e.pinned and e.key != key)
        whole = cache.budget_bytes - pinned - extra
        try:
            n, n_ctx, est, reason = _fitting_parallel(
                info, mode, whole, requested, settings, want, offload, where, unified
            )
        except InsufficientMemoryError as exc:
            exc.details.setdefault("budget_bytes", cache.budget_bytes)
            exc.details.setdefault("runner_baseline_bytes", baseline)
            exc.message = (
                f"{exc.message} (budget {format_bytes(cache.budget_bytes)}, runner baseline "
                f"{format_bytes(baseline)})"
            )
            raise
        small = round_up(requested) if requested else min(n_ctx, round_up(settings.ctx_floor))
        n_ctx, est = small, _estimate(info, small, mode, n, offload, where, unified)
        reason = f"smallest context while waiting for busy models ({reason})"
    why = source if n == want else (
        f"{source} asked for {want}; {n} contexts of {n_ctx} tokens are what fit in memory"
    )
    if where is None or offload:
        cpu = Placement(0, info.block_count + 1, reason="on RPC workers" if offload else "no GPU")
        return Sizing(n_ctx, est, est + extra, reason, n, why, unified, placement=cpu,
                      prompt_cache_bytes=prompts)
    if requested is None:  # an automatic context may shrink to keep layers on the cards
        kept = keep_on_cards(info, mode, n_ctx, n, where, max(settings.ctx_floor, FIT_CTX),
                             unified)  # fmt: skip
        if kept is not None:
            n_ctx, reason = kept
            est = _estimate(info, n_ctx, mode, n, offload, where, unified)
    full, place = planned(info, n_ctx, where, mode=mode, parallel=n, unified=unified)
    return Sizing(n_ctx, est, est + extra, reason, n, why, unified, where.kv_type, place,
                  full.vram, prompts)  # fmt: skip


def keep_on_cards(
    info: ModelInfo, mode: str, n_ctx: int, parallel: int, where: Where, floor: int,
    unified: bool = False,
) -> tuple[int, str] | None:
    """(n_ctx, reason) when a smaller automatic context, not below ``floor`` (or ``n_ctx``),
    puts more layers on the cards: the largest context that keeps as many as the floor would.
    None when shrinking gains no layer.

    Why layers before context: a layer left in RAM slows every token (the CPU computes it),
    while the context grows on demand when a prompt needs it (a reload, planned again then).
    llama.cpp's ``--fit`` shrinks the context first too, but once, for one model against
    what is free; here the cards' room is what the other resident models leave."""
    def layers(n: int) -> int:
        return place(info, n, where.gpus, where.gpu_layers, mode=mode, parallel=parallel,
                     kv_type=where.kv_type, margin=where.margin,
                     unified=unified).gpu_layers  # fmt: skip

    lower = min(n_ctx, round_up(floor))
    now, best = layers(n_ctx), layers(lower)
    if best <= now:
        return None
    kept = largest_fitting(lambda n: layers(n) >= best, lower, n_ctx) or lower
    total = info.block_count + 1
    return kept, (f"{kept} keeps {best} of {total} layers on the GPU (at {n_ctx}: {now}); "
                  "it grows when a prompt needs more")  # fmt: skip


def max_context(
    info: ModelInfo,
    mode: str,
    cache: CachePolicy,
    key: ModelKey,
    baseline: int,
    settings: Settings,
    parallel: int = 1,
    offload: bool = False,
    where: Where | None = None,
    unified: bool = False,
) -> int:
    """The largest n_ctx (per sequence of ``parallel``; ``unified``: their shared pool's)
    ``key`` could ever get in this budget (0 when nothing fits)."""
    pinned = sum(e.accounted_bytes for e in cache.entries() if e.pinned and e.key != key)
    budget = (cache.budget_bytes - pinned - baseline
              - prompt_cache_bytes(mode, settings, cache.budget_bytes))
    limit = info.context_length or (1 << 20)
    found = largest_fitting(
        lambda n: _estimate(info, n, mode, parallel, offload, where, unified) <= budget,
        STEP, limit,
    )
    return found or 0


def context_for_prompt(
    info: ModelInfo,
    name: str,
    key: ModelKey,
    cache: CachePolicy,
    baseline: int,
    settings: Settings,
    prompt_tokens: int,
    max_tokens: int,
    parallel: int = 1,
    offload: bool = False,
    where: Where | None = None,
    current: int = 0,
    unified: bool = False,
) -> int:
    """The n_ctx to reload ``key`` with so a prompt of ``prompt_tokens`` fits (and room to
    answer, up to ``max_tokens`` or 1024), or ContextExceededError saying how many fit.

    With headroom: the ``current`` context doubled until that fits (within the training
    context and the memory), so a conversation that grows by a turn at a time (an agent's)
    does not reload at every turn."""
    train = info.context_length or (1 << 20)
    if prompt_tokens + 1 > train:
        raise ContextExceededError(
            f"the prompt has {prompt_tokens} tokens but {name} was trained for {train} at most",
            hint="shorten the prompt",
            details={"prompt_tokens": prompt_tokens, "n_ctx_train": train},
        )
    fits = max_context(info, key.mode, cache, key, baseline, settings, parallel, offload, where,
                       unified)
    if fits < prompt_tokens + 1:
        raise ContextExceededError(
            f"the prompt has {prompt_tokens} tokens but at most {fits} fit in the memory "
            f"budget for {name}",
            hint="shorten the prompt, unload other models, or raise the memory budget",
            details={"prompt_tokens": prompt_tokens, "n_ctx_max": fits},
        )
    need = round_up(min(train, prompt_tokens + min(max_tokens, 1024)))
    want = max(current, STEP)
    while want < need:
        want *= 2
    want = min(want, max(STEP, train - train % STEP), fits)
    return max(want, round_up(prompt_tokens + 1))


def read_info(path: str) -> ModelInfo:
    """The model's header (fast reader), with I/O errors mapped to modeld errors."""
    from modeld.model.gguf import read_model_info

    try:
        return read_model_info(path)
    except FileNotFoundError as exc:
        raise ModelNotFoundError(f"{path} does not exist", hint="check the path") from exc
    except OSError as exc:
        raise InvalidModelError(f"cannot read {path}: {exc}") from exc

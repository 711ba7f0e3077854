"""How the runner opens a ``llama_cpp.Llama``: the shape of its context and the CPU kernels
that decide whether a greedy reply depends on the batch (issue 26, runner/microbatch.py).

ggml-cpu takes its tiled K-quant matmul (Q4_K, Q6_K, ...) for micro-batches of 8 rows or
more and the per-row dot products below: a row's logits differ between the two (they add the
256-element blocks' partial sums up in another order; both quantize the activations alike).
So a decode call that keeps greedy replies invariant holds at most 7 sequences — unless the
tiled matmul is off, then any number (bench/invariance.py: 8 sequences in one call 158 tok/s
against 110 in two calls of 4; prompts 10-22% slower). ggml reads its switch
(``GGML_CPU_TILED_MM``) once per process, at its first graph computation, so a runner sets it
before opening its first model, and only for a model that decodes more than 7 sequences.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

import llama_cpp

from modeld.model import kvcache
from modeld.model.memory import GENERATE_N_UBATCH
from modeld.runner import microbatch, specs
from modeld.runner.batch import RANDOM_SEED

#: ggml-cpu's switch of its tiled K-quant matmul: on unless set to a number that is 0.
TILED_ENV = "GGML_CPU_TILED_MM"
#: ggml's type ids of the KV cache types (kvcache.KV_CACHE_TYPES)
GGML_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0,
              "q4_0": llama_cpp.GGML_TYPE_Q4_0}  # fmt: skip


class _Process:
    """What this process did with the switch: it is ours to set until the first model opens."""

    opened = False
    turned_off = False  # set by this runner (not inherited): the process suits parallel > 7


def tiled_matmul_on() -> bool:
    """Whether ggml-cpu takes its tiled matmul in this process (its own reading: atoi)."""
    value = os.environ.get(TILED_ENV)
    if value is None:
        return True
    digits = value.lstrip(" \t\n\r\f\v")
    sign = digits[:1] if digits[:1] in "+-" else ""
    digits = digits[len(sign):]
    end = len(digits) - len(digits.lstrip("0123456789"))
    return bool(end) and int(digits[:end]) != 0


def turned_off_here() -> bool:
    """This runner turned the tiled matmul off for its first model: a model loaded later
    would evaluate prompts 10-22% slower, so the process is not worth reusing."""
    return _Process.turned_off


def _choose_tiled(n_seq: int) -> None:
    """Turn the tiled matmul off before the process's first model when that model decodes
    more than :data:`microbatch.MAX_ROWS` sequences (unless the environment already says)."""
    if not _Process.opened and n_seq > microbatch.MAX_ROWS and TILED_ENV not in os.environ:
        os.environ[TILED_ENV] = "0"
        _Process.turned_off = True
    _Process.opened = True


def max_rows(n_seq: int) -> int:
    """Sequences one decode call holds at most: fewer than the tiled matmul takes (8 rows)
    while it is on in this process, else all of them."""
    return microbatch.MAX_ROWS if tiled_matmul_on() else max(1, n_seq)


def n_sequences(spec: specs.LoadSpec) -> int:
    """The sequences the context holds: ``parallel`` in generate mode, else one."""
    return spec.parallel if spec.mode == "generate" else 1


def cells(spec: specs.LoadSpec) -> tuple[int, bool]:
    """The context's cells and whether the sequences share them as one pool (runner/kvpool.py):
    :func:`modeld.model.kvcache.context_cells` of the load."""
    return kvcache.context_cells(spec.n_ctx, n_sequences(spec), spec.kv_unified)


def unified(spec: specs.LoadSpec) -> bool:
    """Whether the sequences share one pool of cells: ``kv_unified`` asked for and more than
    one sequence (one sequence has its pool to itself either way)."""
    return cells(spec)[1]


def open_llama(spec: specs.LoadSpec, n_batch: int) -> llama_cpp.Llama:
    """The one place a Llama is created: flash attention on, SWA caches at window size, and
    ``parallel`` sequences (generate mode) of ``n_ctx`` cells each, or with ``kv_unified``
    sharing one pool of ``n_ctx`` cells."""
    n_seq = n_sequences(spec)
    n_cells, shared = cells(spec)
    _choose_tiled(n_seq)
    cpu_only = spec.gpu_layers == 0 and not spec.rpc
    with _sequences(n_seq, shared), _model_params(repack=n_seq <= 1, cpu_only=cpu_only), \
            _no_chat_handlers():
        llm = llama_cpp.Llama(
            model_path=spec.path,
            n_ctx=n_cells,
            n_batch=n_batch,
            n_ubatch=n_batch if spec.mode != "generate" else min(GENERATE_N_UBATCH, n_batch),
            n_threads=spec.n_threads,
            n_threads_batch=spec.n_threads,
            seed=spec.seed if spec.seed >= 0 else RANDOM_SEED,
            flash_attn=True,
            swa_full=False,
            logits_all=False,
            embedding=spec.mode != "generate",
            verbose=False,
            # with RPC workers every layer goes to them (0 would keep all local, silently)
            n_gpu_layers=-1 if spec.rpc else spec.gpu_layers,
            type_k=GGML_TYPES[spec.type_k],
            type_v=GGML_TYPES[spec.type_v],
            # and the weights are read, not mapped: mapped pages sent to a worker would stay
            # resident here as file-backed memory the daemon charges
            use_mmap=not spec.rpc,
            tensor_split=list(spec.tensor_split) or None,
        )
    # Llama's own token array for its sampling methods, which the runner never calls: its ids
    # (an arange of the vocabulary) are 1 MiB written per process for gemma's 262144 tokens
    llm._candidates = None  # type: ignore[assignment]
    return llm


class _Unused:
    """Stands in for the chat formatter ``Llama.__init__`` compiles from each GGUF template:
    modeld renders templates itself, bounded (:mod:`modeld.runner.template`), and a
    template's syntax error (or a constant its compiler folds to gigabytes) must be that
    model's request error, not a failed load (issue 45: a 500)."""

    def __init__(self, **_: object) -> None:
        pass

    def to_chat_handler(self) -> object:
        return _unused


def _unused(*_: object, **__: object) -> None:
    raise RuntimeError("modeld renders chat templates itself (runner/template.py)")


@contextlib.contextmanager
def _no_chat_handlers() -> Iterator[None]:
    """``Llama.__init__`` without its chat handlers (see :class:`_Unused`)."""
    module = llama_cpp.llama_chat_format
    real = module.Jinja2ChatFormatter
    module.Jinja2ChatFormatter = _Unused  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        module.Jinja2ChatFormatter = real  # type: ignore[misc]


@contextlib.contextmanager
def _sequences(n_seq: int, unified: bool) -> Iterator[None]:
    """Make the context ``Llama`` creates hold ``n_seq`` sequences, each in its own KV stream
    of ``n_ctx / n_seq`` cells (llama-server's layout without ``--kv-unified``: a sequence
    attends only to its own cells), or with ``unified`` all in one stream of ``n_ctx`` cells
    (any sequence may fill it; its attention then spans the others' cells too, masked, so its
    logits differ in the last bits: runner/kvpool.py). ``Llama`` has no such argument, and its
    context is created in its constructor, so its source of default context parameters
    answers for it meanwhile."""
    if n_seq <= 1:
        yield
        return
    default = llama_cpp.llama_cpp.llama_context_default_params

    def with_sequences() -> llama_cpp.llama_context_params:
        params: llama_cpp.llama_context_params = default()
        params.n_seq_max, params.kv_unified = n_seq, unified
        return params

    llama_cpp.llama_cpp.llama_context_default_params = with_sequences
    try:
        yield
    finally:
        llama_cpp.llama_cpp.llama_context_default_params = default


@contextlib.contextmanager
def _model_params(*, repack: bool, cpu_only: bool) -> Iterator[None]:
    """Load without llama.cpp's repacked weights unless ``repack``: their kernels compute a
    micro-batch's rows four at a time and the rest one by one, so a sequence decoded beside
    others would get other logits (runner/microbatch.py). Measured cost: 3-5% of the wall-clock
    decode rate with 2 threads (issue 26), none in CPU time per token with 1 thread
    (docs/benchmarks.md). ``cpu_only``: give the model no GPU device at all (an empty device
    list): with a GPU backend built in, llama.cpp would otherwise create a CUDA context (~720 MB
    of VRAM, DESIGN.md 12) and send large batches' matmuls to the card even with no layer there.
    The high-level ``Llama`` has neither argument: as :func:`_sequences`, its source of default
    model parameters answers for it meanwhile."""
    if repack and not cpu_only:
        yield
        return
    default = llama_cpp.llama_cpp.llama_model_default_params
    no_devices = (ctypes.c_void_p * 1)(None)  # NULL-terminated: kept alive through the load

    def patched() -> llama_cpp.llama_model_params:
        params: llama_cpp.llama_model_params = default()
        if not repack:
            params.use_extra_bufts = False
        if cpu_only:
            params.devices = ctypes.addressof(no_devices)  # type: ignore[assignment]
        return params

    llama_cpp.llama_cpp.llama_model_default_params = patched
    try:
        yield
    finally:
        llama_cpp.llama_cpp.llama_model_default_params = default

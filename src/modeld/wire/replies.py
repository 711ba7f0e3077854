"""The shapes of replies: ``ps`` rows, ``done`` bodies and the runner's messages, as TypedDicts.

Why: these are plain dicts on the wire (JSON) and in the code that builds them; declaring their
keys once lets mypy check the builders (:mod:`modeld.daemon.jobs`, :mod:`modeld.wire.runnerwire`)
and tells a caller of :class:`modeld.client.Client` what it gets back. docs/protocol.md is the
description; tests/test_replies.py checks that what the builders make has exactly these keys.
Pure: standard library only. No ``from __future__ import annotations`` here: Python 3.11
reads ``NotRequired`` in a TypedDict only from evaluated annotations.
"""

from typing import Any, Literal, NotRequired, TypedDict

# ----------------------------------------------------------------------------- shared parts


class Usage(TypedDict, total=False):
    """Tokens a request used (generate reports all three, embed and rerank the prompt only)."""

    prompt_tokens: int
    prompt_tokens_reused: int
    completion_tokens: int


class RerankResult(TypedDict):
    index: int  # the document's position in the request
    relevance_score: float


# ----------------------------------------------------------------------------- client replies


class GenerateTimings(TypedDict):
    load_s: float  # the load this request waited for (0 on a cache hit)
    prompt_eval_s: float
    generation_s: float
    tokens_per_s: float
    batched_max: int  # the most requests that shared one of its decode steps, itself included
    draft_tokens: int  # tokens drafted from the context and checked (runner/speculate.py)
    draft_accepted: int  # of those, the ones the model agreed with: decode steps saved
    prompt_tokens: int
    prompt_tokens_reused: int
    completion_tokens: int
    total_s: float


class ToolCallDone(TypedDict):
    """A tool call the reply made: ``arguments`` is the JSON text of an object."""

    id: str
    name: str
    arguments: str


class ValidationProblem(TypedDict):
    """One way a reply fails its schema."""

    at: str  # a JSON pointer into the done body's reply ("" the text, /tool_calls/0/arguments/x)
    keyword: str  # the schema keyword it fails ("" when the reply is not complete JSON)
    message: str


class Validation(TypedDict):
    """A constrained reply checked against its whole schema once complete (issue 35)."""

    valid: bool
    errors: list[ValidationProblem]  # at most 10; empty when valid
    unchecked: list[str]  # ``format`` values modeld has no check for, and where


class GenerateDone(TypedDict):
    """The ``done`` body of a ``generate`` request."""

    model: str
    n_ctx: int | None
    usage: Usage
    finish_reason: str | None  # "stop", "length", "eos" or "tool_calls"
    timings: GenerateTimings
    tool_calls: NotRequired[list[ToolCallDone]]  # the calls the reply made, in order
    stop_sequence: NotRequired[str]  # the stop string that ended the reply, when one did
    length_reason: NotRequired[str]  # finish "length": "max_tokens" or "context_window"
    validation: NotRequired[Validation]  # a reply held to a schema (format, forced call)


class PooledTimings(TypedDict, total=False):
    """Timings of an embed or rerank request: the runner's own (``embed_s`` or ``rerank_s``)
    plus the load waited for and the prompt tokens."""

    load_s: float
    prompt_tokens: int
    embed_s: float
    rerank_s: float


class EmbedDone(TypedDict):
    model: str
    n_ctx: int | None
    usage: Usage
    embeddings: list[list[float]]  # one L2-normalized vector per input, in order
    timings: PooledTimings


class RerankDone(TypedDict):
    model: str
    n_ctx: int | None
    usage: Usage
    results: list[RerankResult]  # input order, or the top_n best, best first
    timings: PooledTimings


DoneBody = GenerateDone | EmbedDone | RerankDone


class DeviceShare(TypedDict):
    """What one ggml device holds of a model (``ps``/``show`` of a model with RPC workers):
    llama.cpp's reported buffers, and the device's memory when it was loaded."""

    device: str  # "CPU", "RPC0", "RPC1", ...
    endpoint: str | None  # the worker of an RPC device
    model_bytes: int  # weights
    kv_bytes: int  # KV cache
    compute_bytes: int
    free_bytes: int | None  # the device's free memory after the load (None: unknown)
    total_bytes: int | None
    # an RPC worker's share as planned before the load (modeld.rpc.layout), beside the above
    planned_layers: NotRequired[int]
    planned_model_bytes: NotRequired[int]
    planned_kv_bytes: NotRequired[int]
    planned_compute_bytes: NotRequired[int]
    plan_memory_bytes: NotRequired[int]  # the worker's memory it was planned against


class PsRow(TypedDict):
    """One ``ps`` row: a loading, ready or unloading model, or one waiting for room."""

    name: str
    path: str
    mode: str
    state: str  # "loading", "ready", "unloading", "failed" (cache states) or "waiting"
    n_ctx: int | None
    ctx_reason: str | None
    parallel: int | None
    kv_unified: bool  # its sequences share one pool of n_ctx cells
    parallel_reason: str | None
    measured_bytes: int | None
    estimate_bytes: int | None
    accounted_bytes: int
    in_flight: int
    queued: int
    use_count: int
    last_used: float | None  # Unix time
    keep_alive_s: float | None  # None: until memory is needed
    keep_alive_left_s: float | None
    forever: bool
    pinned: bool
    runner_id: str | None
    runner_pid: int | None
    load_seconds: float | None
    retiring: str | None  # why it goes once idle (file_changed, explicit)
    last_unload_reason: str | None
    rpc: NotRequired[list[str]]  # its llama.cpp RPC workers (only for such a model)
    devices: NotRequired[list[DeviceShare]]  # what each device holds (only with rpc)
    layers_offloaded: NotRequired[str]  # "13/13" (only with rpc)
    kv_cache_type: NotRequired[str]  # f16, q8_0, q4_0
    processor: NotRequired[str]  # as ollama ps: "100% GPU", "35%/65% CPU/GPU", "100% CPU"
    gpu_layers: NotRequired[int]  # layers planned on the GPUs
    size_vram: NotRequired[int]  # bytes on the GPUs: NVML's for its runner, else the plan
    vram_measured: NotRequired[int | None]  # NVML's bytes of its runner (None: not yet)
    n_layers: NotRequired[int]  # its layers, the output layer counted (llama.cpp's count)
    layers: NotRequired[dict[str, str]]  # which layers where: {"RAM": "0-9", "CUDA0": "10-22"}
    vram_estimate: NotRequired[int]  # the plan's bytes on the GPUs
    vram_per_gpu: NotRequired[list[int]]  # the plan, per card
    gpu_reason: NotRequired[str]  # why that many layers


class UnloadedRow(TypedDict):
    """What a ``load`` reply carries when its model left again before the reply was built."""

    path: str
    mode: str
    state: Literal["unloaded"]


class PsReply(TypedDict):
    models: list[PsRow]
    budget_bytes: int
    used_bytes: int
    max_models: int


# ----------------------------------------------------------------------------- runner messages


class RunnerMemory(TypedDict):
    """A runner's memory in bytes as :func:`modeld.model.probe.own_memory` measures it (or the part
    above its baseline, a ``footprint``)."""

    rss: int
    anon: int  # anonymous pages (heap, KV cache)
    file: int  # file-backed pages (the mapped model): rss - anon
    gpu: NotRequired[int]  # NVML's per-process bytes, where known


class RunnerHello(TypedDict):
    """A runner's first message: its pid and memory before any model is loaded."""

    type: Literal["hello"]
    pid: int
    baseline: RunnerMemory
    runner_id: NotRequired[str]
    llama_cpp_version: NotRequired[str]
    rpc_supported: NotRequired[bool]  # built with llama.cpp's RPC backend (-DGGML_RPC=ON)
    devices: NotRequired[list[dict[str, Any]]]  # llama.cpp's devices: name, description, type


class RunnerLoaded(TypedDict):
    """A successful load (the optional keys are absent from runners that predate them)."""

    type: Literal["loaded"]
    n_ctx: int  # per sequence
    n_ctx_train: int
    load_s: float
    warmup_s: float
    chat_format: str
    memory: RunnerMemory
    footprint: RunnerMemory  # memory above the runner's baseline
    parallel: NotRequired[int]  # sequences decoded together (absent: 1)
    greedy_batch_invariant: NotRequired[bool]  # batching never changes greedy tokens
    kv_unified: NotRequired[bool]  # one pool of n_ctx cells shared by the sequences
    mode: NotRequired[str]
    architecture: NotRequired[str]
    has_chat_template: NotRequired[bool]
    vision: NotRequired[bool]  # an image projector was loaded beside the model (issue 38)
    devices: NotRequired[list[DeviceShare]]  # with rpc workers: what each device holds
    layers_offloaded: NotRequired[str]  # with rpc workers: "N/M" as llama.cpp logged


class RunnerMemoryReply(TypedDict):
    """The runner's answer to ``memory``, and its ``unloaded`` after an ``unload``."""

    type: Literal["memory", "unloaded"]
    memory: RunnerMemory
    footprint: RunnerMemory
    reusable: NotRequired[bool]  # unloaded: false when the process should be stopped


class RunnerGenerateDone(TypedDict):
    type: Literal["done"]
    rid: str
    finish_reason: str
    usage: Usage
    # prompt_eval_s, generation_s, tokens_per_s, batched_max; draft_tokens, draft_accepted and
    # draft_steps when it drafted
    timings: dict[str, float]
    memory: NotRequired[RunnerMemory]  # measured right after
    tool_calls: NotRequired[list[ToolCallDone]]
    stop_sequence: NotRequired[str]
    length_reason: NotRequired[str]  # "max_tokens" | "context_window" (finish "length")
    resume: NotRequired[list[int]]  # the tokens so far: continue in a larger context


class RunnerEmbedDone(TypedDict):
    type: Literal["done"]
    rid: str
    embeddings: list[list[float]]
    usage: Usage
    timings: dict[str, float]  # embed_s
    memory: NotRequired[RunnerMemory]  # measured right after


class RunnerRerankDone(TypedDict):
    type: Literal["done"]
    rid: str
    results: list[RerankResult]
    usage: Usage
    timings: dict[str, float]  # rerank_s
    memory: NotRequired[RunnerMemory]  # measured right after


class RunnerError(TypedDict):
    type: Literal["error"]
    rid: str | None
    code: str
    message: str
    hint: str
    details: dict[str, Any]

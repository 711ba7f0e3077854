"""What a runner is asked to do, validated: the daemon's ``load``, ``generate``, ``embed`` and
``rerank`` messages (built by :mod:`modeld.runnerwire`) parsed into typed specs.

Why separate: building and encoding serve both ends; validation is the receiving runner's
job, and its errors name the field so a daemon bug is obvious.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modeld import options, requestfields
from modeld.config import PROMPT_CACHE_MIB
from modeld.errors import InvalidRequestError
from modeld.memory import KV_CACHE_TYPES
from modeld.messages import forces_call
from modeld.options import Sampling
from modeld.protocol import MAX_PARALLEL, MODES, ProtocolError
from modeld.requestfields import Asked, Decided

#: Streamed text is sent at most this often per sequence (the first piece at once). Each message
#: wakes the daemon and the client; on 2 cores one per token cost ~3% of the decode rate because
#: they preempt llama.cpp's threads (bench streaming: 0.96-0.97 of in-process, 0.985 coalesced).
CHUNK_INTERVAL_S = 0.04
#: The same for a request whose client reads the reply whole (``stream`` false: HTTP
#: ``"stream": false``): nobody reads the pieces, so they only wake the daemon (on RPC workers
#: the 40 ms chunks cost up to 8% of the decode rate: docs/benchmarks.md). One a second still
#: tells the daemon the request progresses (its stall watch on RPC workers: runner_stall_s).
QUIET_INTERVAL_S = 1.0


@dataclass(frozen=True)
class LoadSpec:
    path: str
    mode: str
    n_ctx: int
    n_threads: int
    n_batch: int
    seed: int
    chat_format: str | None
    prompt_cache_mib: int = PROMPT_CACHE_MIB  # absent from older daemons: the default
    warm_up: bool = True
    prompt_cache_dir: str | None = None
    parallel: int = 1  # sequences decoded together (generate mode)
    rpc: tuple[str, ...] = ()  # llama.cpp RPC workers to offload every layer to
    rpc_ctx_floor: int | None = None  # n_ctx may be lowered to this to fit the workers
    rpc_memory: int | None = None  # bytes of each worker's memory to plan with (None: free)
    tensor_split: tuple[float, ...] = ()  # llama.cpp's split weights (empty: by free memory)
    gpu_layers: int = 0  # layers on the GPUs (-1: all); 0: CPU only, no GPU touched at all
    type_k: str = "f16"  # KV cache types (memory.KV_CACHE_TYPES)
    type_v: str = "f16"
    handoff: str | None = None  # file prefix of the previous runner's sequences (handoff.py)
    handoff_pid: int | None = None  # that runner's process (its exit ends the wait)
    mmproj: str | None = None  # the image projector to load beside the model (issue 38)


@dataclass(frozen=True, kw_only=True)
class GenerateSpec(Asked, Decided):
    """A runner's generate request: what the client asked and the daemon decided (their fields
    declared in :mod:`modeld.requestfields`), its sampling and the daemon's ``rid``."""

    rid: str
    sampling: Sampling

    @property
    def chunk_interval_s(self) -> float:
        """How often this request's text goes to the daemon at most."""
        return CHUNK_INTERVAL_S if self.stream else QUIET_INTERVAL_S

    @property
    def forced_tools(self) -> bool:
        """The reply must be a tool call (``required`` or one named tool: a grammar says so)."""
        return forces_call(self.tools, self.tool_choice)


@dataclass(frozen=True)
class EmbedSpec:
    rid: str
    inputs: tuple[str, ...]
    n_threads: int | None = None


def parse_load(msg: Mapping[str, Any]) -> LoadSpec:
    path = _str(msg, "path")
    mode = msg.get("mode", "generate")
    if mode not in MODES:
        raise ProtocolError(f"load: 'mode' must be one of {MODES}, got {mode!r}")
    n_ctx = _int(msg, "n_ctx", 256, 1 << 24)
    if n_ctx % 256:
        raise ProtocolError(f"load: 'n_ctx' must be a multiple of 256, got {n_ctx}")
    chat_format = msg.get("chat_format")
    if chat_format is not None and not isinstance(chat_format, str):
        raise ProtocolError("load: 'chat_format' must be a string")
    warm_up = msg.get("warm_up", True)
    if not isinstance(warm_up, bool):
        raise ProtocolError("load: 'warm_up' must be a boolean")
    cache_dir = msg.get("prompt_cache_dir")
    if cache_dir is not None and (not isinstance(cache_dir, str) or not cache_dir):
        raise ProtocolError("load: 'prompt_cache_dir' must be a non-empty string")
    return LoadSpec(
        path=path,
        mode=str(mode),
        n_ctx=n_ctx,
        n_threads=_int(msg, "n_threads", 1, 1024),
        n_batch=_int(msg, "n_batch", 1, 1 << 20, 512),
        seed=_int(msg, "seed", -(1 << 31), (1 << 32) - 1, 0),
        chat_format=chat_format,
        prompt_cache_mib=_int(msg, "prompt_cache_mib", 0, 1 << 20, PROMPT_CACHE_MIB),
        warm_up=warm_up,
        prompt_cache_dir=cache_dir,
        parallel=_int(msg, "parallel", 1, MAX_PARALLEL, 1),
        rpc=_rpc(msg.get("rpc")),
        rpc_ctx_floor=_int(msg, "rpc_ctx_floor", 256, 1 << 24) if "rpc_ctx_floor" in msg else None,
        rpc_memory=_int(msg, "rpc_memory", 1, 1 << 62) if "rpc_memory" in msg else None,
        tensor_split=_split(msg.get("tensor_split")),
        gpu_layers=_int(msg, "gpu_layers", -1, 1 << 16, 0),
        type_k=_kv_type(msg, "type_k"),
        type_v=_kv_type(msg, "type_v"),
        handoff=_opt_str(msg, "handoff"),
        handoff_pid=_int(msg, "handoff_pid", 1, 1 << 31) if "handoff_pid" in msg else None,
        mmproj=_opt_str(msg, "mmproj"),
    )


def _split(value: object) -> tuple[float, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in value
    ):
        raise ProtocolError("load: 'tensor_split' must be a list of non-negative numbers")
    return tuple(float(x) for x in value)


def _kv_type(msg: Mapping[str, Any], key: str) -> str:
    value = msg.get(key, "f16")
    if value not in KV_CACHE_TYPES:
        raise ProtocolError(f"load: {key!r} must be one of {', '.join(KV_CACHE_TYPES)}")
    return str(value)


def _opt_str(msg: Mapping[str, Any], key: str) -> str | None:
    value = msg.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ProtocolError(f"load: {key!r} must be a non-empty string")
    return value


def _rpc(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ProtocolError("load: 'rpc' must be a list of \"HOST:PORT\" strings")
    from modeld.rpc import parse_endpoints

    try:
        return parse_endpoints(value)
    except InvalidRequestError as exc:
        raise ProtocolError(f"load: {exc.message}") from exc


def parse_generate(msg: Mapping[str, Any]) -> GenerateSpec:
    rid = _str(msg, "rid")

    def fail(text: str) -> ProtocolError:
        return ProtocolError(f"generate: {text}")

    fields = requestfields.parse(msg, requestfields.RUNNER, fail)
    return GenerateSpec(rid=rid, sampling=options.parse(msg, fail), **fields)


def parse_embed(msg: Mapping[str, Any]) -> EmbedSpec:
    rid = _str(msg, "rid")
    inputs = msg.get("inputs")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not (isinstance(inputs, list) and inputs and all(isinstance(s, str) for s in inputs)):
        raise ProtocolError("embed: 'inputs' must be a non-empty list of strings")
    return EmbedSpec(
        rid=rid, inputs=tuple(inputs), n_threads=_int(msg, "n_threads", 0, 1024, 0) or None
    )


@dataclass(frozen=True)
class RerankSpec:
    rid: str
    query: str
    documents: tuple[str, ...]
    top_n: int | None = None
    n_threads: int | None = None


def parse_rerank(msg: Mapping[str, Any]) -> RerankSpec:
    query, docs = msg.get("query"), msg.get("documents")
    if not isinstance(query, str):
        raise ProtocolError("rerank: 'query' must be a string")
    if not (isinstance(docs, list) and docs and all(isinstance(d, str) for d in docs)):
        raise ProtocolError("rerank: 'documents' must be a non-empty list of strings")
    top_n = _int(msg, "top_n", 1, 1 << 20, 0) if msg.get("top_n") is not None else None
    return RerankSpec(_str(msg, "rid"), query, tuple(docs), top_n,
                      _int(msg, "n_threads", 0, 1024, 0) or None)  # fmt: skip


def _str(msg: Mapping[str, Any], key: str) -> str:
    value = msg.get(key)
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"{msg.get('type')}: {key!r} must be a non-empty string")
    return value


def _int(msg: Mapping[str, Any], key: str, lo: int, hi: int, default: int | None = None) -> int:
    value = msg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ProtocolError(f"{msg.get('type')}: {key!r} must be an integer in [{lo}, {hi}]")
    return value

"""Runner wire protocol: the messages between the daemon and its runner processes (no zmq here).

The daemon binds one ROUTER; each runner connects a DEALER whose identity is its runner id.
Every message is one ZeroMQ frame holding one UTF-8 JSON object with a ``type``; request-scoped
messages carry ``rid`` (the daemon's request id). This module builds, encodes and decodes those
objects, so both ends share one definition and it can be tested by round-trip; the runner
validates what it receives with :mod:`modeld.runner.specs`. The full description is in
``docs/protocol.md`` ("Runner protocol").

daemon -> runner: ``load``, ``generate``, ``embed``, ``rerank``, ``cancel``, ``memory``,
``shutdown``, ``unload``.
runner -> daemon: ``hello``, ``loaded``, ``load_failed``, ``chunk``, ``done``, ``error``,
``memory``; and ``heartbeat`` every :data:`HEARTBEAT_S` from a thread of the runner's own, on a
second DEALER identified as :func:`heartbeat_identity` (so it flows while llama.cpp computes).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

from modeld.errors import ErrorCode
from modeld.wire import frames, loadfields, requestfields
from modeld.wire.options import DEFAULTS as DEFAULT_SAMPLING
from modeld.wire.options import NAMES as OPTION_NAMES
from modeld.wire.options import Sampling
from modeld.wire.protocol import ProtocolError
from modeld.wire.replies import (
    DeviceShare,
    RerankResult,
    RunnerEmbedDone,
    RunnerError,
    RunnerGenerateDone,
    RunnerHello,
    RunnerLoaded,
    RunnerMemory,
    RunnerMemoryReply,
    RunnerRerankDone,
    ToolCallDone,
)

#: Largest frame of a runner message accepted by :func:`decode` (embeddings of many inputs
#: can be large).
MAX_RUNNER_MESSAGE_BYTES = 64 * 1024 * 1024

#: Types the daemon sends to a runner.
TO_RUNNER = frozenset(
    {"load", "generate", "embed", "rerank", "cancel", "memory", "shutdown", "unload", "handoff"}
)
#: Types a runner sends to the daemon.
FROM_RUNNER = frozenset(
    {"hello", "loaded", "load_failed", "chunk", "done", "error", "memory", "unloaded", "heartbeat"}
)
#: Seconds between a runner's heartbeats (the daemon's ``runner_stall_s`` is many of these).
HEARTBEAT_S = 1.0
HEARTBEAT_SUFFIX = "/hb"
#: finish_reason values of a generate ``done``.
FINISH_REASONS = ("stop", "length", "eos", "tool_calls")


# --------------------------------------------------------------------------- building


def heartbeat_identity(runner_id: str) -> str:
    """The identity of a runner's heartbeat socket (the daemon maps it back to the runner)."""
    return runner_id + HEARTBEAT_SUFFIX


def heartbeat() -> dict[str, Any]:
    """"Still here": sent by a runner's heartbeat thread, whatever its main thread is doing."""
    return {"type": "heartbeat"}


def hello(
    pid: int,
    baseline: Mapping[str, int],
    *,
    runner_id: str | None = None,
    llama_cpp_version: str | None = None,
    rpc_supported: bool | None = None,
    devices: Sequence[Mapping[str, Any]] | None = None,
) -> RunnerHello:
    """First message of a runner: who it is, its memory before any model is loaded and the
    llama.cpp devices it sees (name, description, type: ``cpu``, ``gpu``, ...)."""
    msg: RunnerHello = {"type": "hello", "pid": pid, "baseline": _memory(baseline)}
    if runner_id is not None:
        msg["runner_id"] = runner_id
    if llama_cpp_version is not None:
        msg["llama_cpp_version"] = llama_cpp_version
    if rpc_supported is not None:
        msg["rpc_supported"] = rpc_supported
    if devices is not None:
        msg["devices"] = [dict(d) for d in devices]
    return msg


def load(path: str | os.PathLike[str], **fields: Any) -> dict[str, Any]:
    """Ask a runner to load a model: ``fields`` are those of
    :class:`modeld.wire.loadfields.LoadSpec` (``n_ctx`` and ``n_threads`` required; ``n_ctx`` a
    positive multiple of 256). Those at their defaults are left out but for the few every runner
    message has always carried. ``warm_up`` false: a request is about to run anyway (it pays the
    same first-use costs, so a warm-up would only delay it). ``rpc_ctx_floor`` (with ``rpc``): the
    runner may lower ``n_ctx`` down to it so every worker's share fits its memory (None: ``n_ctx``
    was asked for; a share that does not fit fails the load). ``handoff``: the file prefix the
    model's previous runner (process ``handoff_pid``) writes its sequences' cells to
    (:func:`handoff`): wait for them and restore them (runner/handoff.py).
    """
    return {"type": "load", **loadfields.write({"path": os.fspath(path), **fields})}


def loaded(
    *,
    n_ctx: int,
    n_ctx_train: int,
    load_s: float,
    warmup_s: float,
    chat_format: str,
    memory: Mapping[str, int],
    footprint: Mapping[str, int],
    parallel: int | None = None,
    greedy_batch_invariant: bool | None = None,
    kv_unified: bool = False,
    mode: str | None = None,
    architecture: str | None = None,
    has_chat_template: bool | None = None,
    vision: bool = False,
    devices: Sequence[Mapping[str, Any]] | None = None,
    layers_offloaded: str | None = None,
) -> RunnerLoaded:
    """A successful load: the real context, timings and the measured memory footprint; the
    optional facts (None: left out) follow in this order."""
    msg: RunnerLoaded = {
        "type": "loaded",
        "n_ctx": n_ctx,
        "n_ctx_train": n_ctx_train,
        "load_s": load_s,
        "warmup_s": warmup_s,
        "chat_format": chat_format,
        "memory": _memory(memory),
        "footprint": _memory(footprint),
    }
    if parallel is not None:
        msg["parallel"] = parallel
    if greedy_batch_invariant is not None:
        msg["greedy_batch_invariant"] = greedy_batch_invariant
    if kv_unified:  # one pool of n_ctx cells shared by the sequences
        msg["kv_unified"] = True
    if mode is not None:
        msg["mode"] = mode
    if architecture is not None:
        msg["architecture"] = architecture
    if has_chat_template is not None:
        msg["has_chat_template"] = has_chat_template
    if vision:  # an image projector was loaded beside the model
        msg["vision"] = True
    if devices is not None:
        msg["devices"] = [cast(DeviceShare, dict(d)) for d in devices]
    if layers_offloaded is not None:
        msg["layers_offloaded"] = layers_offloaded
    return msg


def load_failed(
    code: str | ErrorCode, message: str, hint: str = "", details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A failed load; the runner stays alive and may be sent another ``load``."""
    msg: dict[str, Any] = {
        "type": "load_failed", "code": _code(code), "message": message, "hint": hint,
    }  # fmt: skip
    if details:
        msg["details"] = dict(details)
    return msg


def generate(rid: str, *, sampling: Sampling = DEFAULT_SAMPLING, **fields: Any) -> dict[str, Any]:
    """A generation request: ``fields`` are those of :mod:`modeld.wire.requestfields` (what the
    client asked, what the daemon decided: ``prompt`` or ``messages``, ``raw``, ``think``,
    ``grammar``, ...) and sampling options that override ``sampling``'s (``max_tokens=16``).
    The daemon adds ``n_threads`` when it sends one, and ``grow``/``resume`` when a reply
    outgrows its context (runner/resume.py)."""
    overrides: dict[str, Any] = {k: tuple(v) if k == "stop" else v
                                 for k, v in fields.items() if k in OPTION_NAMES}  # fmt: skip
    if overrides:
        sampling = dataclasses.replace(sampling, **overrides)
    asked = {k: v for k, v in fields.items() if k not in OPTION_NAMES}
    return {"type": "generate", "rid": rid, **sampling.to_wire(), **requestfields.to_wire(asked)}


def embed(rid: str, inputs: Sequence[str]) -> dict[str, Any]:
    return {"type": "embed", "rid": rid, "inputs": list(inputs)}


def rerank(
    rid: str, query: str, documents: Sequence[str], top_n: int | None = None
) -> dict[str, Any]:
    msg: dict[str, Any] = {"type": "rerank", "rid": rid, "query": query,
                           "documents": list(documents)}
    if top_n is not None:
        msg["top_n"] = top_n
    return msg


def cancel(rid: str) -> dict[str, Any]:
    return {"type": "cancel", "rid": rid}


def shutdown() -> dict[str, Any]:
    return {"type": "shutdown"}


def handoff(prefix: str) -> dict[str, Any]:
    """Before a reload with a larger context: write each sequence's cells and tokens to files
    named from ``prefix``, then the manifest, for the next runner's ``load`` (no reply)."""
    return {"type": "handoff", "prefix": prefix}


def unload() -> dict[str, Any]:
    """Close the model but keep the process (the daemon may reuse it as the spare runner)."""
    return {"type": "unload"}


def unloaded(memory: Mapping[str, int], footprint: Mapping[str, int], *,
             reusable: bool = True) -> RunnerMemoryReply:
    """After ``unload``: what the process holds now, and above its baseline (``footprint``);
    ``reusable`` false: the process should not load another model (runner/llamaopen.py)."""
    reply: RunnerMemoryReply = {"type": "unloaded", "memory": _memory(memory),
                                "footprint": _memory(footprint)}  # fmt: skip
    if not reusable:
        reply["reusable"] = False
    return reply


def memory_request() -> dict[str, Any]:
    return {"type": "memory"}


def memory_reply(memory: Mapping[str, int], footprint: Mapping[str, int]) -> RunnerMemoryReply:
    return {"type": "memory", "memory": _memory(memory), "footprint": _memory(footprint)}


def chunk(
    rid: str,
    text: str,
    tokens: int | None = None,
    *,
    thinking: str = "",
    tool_calls: Sequence[Mapping[str, Any]] = (),
    calls_done: Sequence[ToolCallDone] = (),
    logprobs: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Generated text; ``tokens``: completion tokens so far (a chunk may hold several).
    Optional parts, in the reply's order: ``thinking`` (before the text), ``tool_calls``
    (OpenAI-style deltas: ``index``, then ``id``/``name`` once, ``arguments`` fragments),
    ``calls_done`` (the calls completed, whole) and ``logprobs`` (an entry per token)."""
    msg: dict[str, Any] = {"type": "chunk", "rid": rid, "text": text}
    if tokens is not None:
        msg["tokens"] = tokens
    if thinking:
        msg["thinking"] = thinking
    if tool_calls:
        msg["tool_calls"] = [dict(c) for c in tool_calls]
    if calls_done:
        msg["calls_done"] = list(calls_done)
    if logprobs:
        msg["logprobs"] = [dict(e) for e in logprobs]
    return msg


def done_generate(
    rid: str,
    *,
    finish_reason: str,
    prompt_tokens: int,
    prompt_tokens_reused: int,
    completion_tokens: int,
    prompt_eval_s: float,
    generation_s: float,
    batched_max: int = 1,
    memory: Mapping[str, int] | None = None,
    tool_calls: Sequence[ToolCallDone] = (),
    stop_sequence: str | None = None,
    length_reason: str | None = None,
    resume: Sequence[int] = (),
    drafts: Mapping[str, int] | None = None,
) -> RunnerGenerateDone:
    """The end of a generation, with usage and timings (tokens_per_s over generation_s;
    ``batched_max``: the most sequences that shared one of its decode steps, itself included).

    ``memory`` (optional): the runner's memory measured right after, so the daemon's accounting
    follows growth (buffers allocated on first use of a long context). ``length_reason`` (with
    ``length``): ``max_tokens`` reached, or ``context_window`` (the sequence's cells ran out).
    ``resume`` (with ``context_window``, when the request allowed ``grow``): the tokens written
    so far; the daemon continues the reply in a larger context (runner/resume.py).
    ``drafts``: what prompt-lookup drafting did (runner/speculate.py ``Counts``), in the
    timings.
    """
    tps = completion_tokens / generation_s if generation_s > 0 else 0.0
    msg: RunnerGenerateDone = {
        "type": "done",
        "rid": rid,
        "finish_reason": finish_reason,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "prompt_tokens_reused": prompt_tokens_reused,
            "completion_tokens": completion_tokens,
        },
        "timings": {
            "prompt_eval_s": prompt_eval_s,
            "generation_s": generation_s,
            "tokens_per_s": tps,
            "batched_max": batched_max,
            **(drafts or {}),
        },
    }
    if memory is not None:
        msg["memory"] = _memory(memory)
    if tool_calls:
        msg["tool_calls"] = list(tool_calls)
    if stop_sequence is not None:
        msg["stop_sequence"] = stop_sequence
    if length_reason is not None:
        msg["length_reason"] = length_reason
    if resume:
        msg["resume"] = list(resume)
    return msg


def done_embed(
    rid: str,
    embeddings: Sequence[Sequence[float]],
    prompt_tokens: int,
    embed_s: float,
    memory: Mapping[str, int] | None = None,
) -> RunnerEmbedDone:
    """The embeddings of an ``embed`` request, one vector per input, in order."""
    msg: RunnerEmbedDone = {
        "type": "done",
        "rid": rid,
        "embeddings": [list(e) for e in embeddings],
        "usage": {"prompt_tokens": prompt_tokens},
        "timings": {"embed_s": embed_s},
    }
    if memory is not None:
        msg["memory"] = _memory(memory)
    return msg


def done_rerank(
    rid: str,
    scores: Sequence[float],
    top_n: int | None,
    prompt_tokens: int,
    rerank_s: float,
    memory: Mapping[str, int] | None = None,
) -> RunnerRerankDone:
    """The scores of a ``rerank`` request as ``results`` of ``index`` and ``relevance_score``
    (llama-server's names): in input order, or the ``top_n`` best, best first (ties keep
    their input order)."""
    results: list[RerankResult] = [
        {"index": i, "relevance_score": float(x)} for i, x in enumerate(scores)
    ]
    if top_n is not None:
        results = sorted(results, key=lambda r: -r["relevance_score"])[:top_n]
    msg: RunnerRerankDone = {"type": "done", "rid": rid, "results": results,
                           "usage": {"prompt_tokens": prompt_tokens},
                           "timings": {"rerank_s": rerank_s}}  # fmt: skip
    if memory is not None:
        msg["memory"] = _memory(memory)
    return msg


def error(
    rid: str | None,
    code: str | ErrorCode,
    message: str,
    details: Mapping[str, Any] | None = None,
    hint: str = "",
) -> RunnerError:
    """A request failed (or was cancelled); ``rid`` is None when it could not be read."""
    return {
        "type": "error",
        "rid": rid,
        "code": _code(code),
        "message": message,
        "hint": hint,
        "details": dict(details or {}),
    }


def _code(code: str | ErrorCode) -> str:
    return code.value if isinstance(code, ErrorCode) else code


def _memory(measured: Mapping[str, int]) -> RunnerMemory:
    """A copy of a measurement (:func:`modeld.model.probe.own_memory`, or a difference of two),
    typed: the probe builds it as a plain ``dict[str, int]`` of these keys."""
    return cast(RunnerMemory, dict(measured))


# --------------------------------------------------------------------------- encoding


def encode(msg: Mapping[str, Any]) -> list[bytes]:
    """A JSON frame, then one frame per binary value (images: :mod:`modeld.wire.frames`).
    NaN/inf are refused (ProtocolError) rather than sent as invalid JSON."""
    try:
        return frames.dumps(msg)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"runner message cannot be encoded: {exc}") from exc


def decode(parts: Sequence[bytes], *, max_bytes: int = MAX_RUNNER_MESSAGE_BYTES) -> dict[str, Any]:
    """Parse one message (a JSON-object frame with a string ``type``, then the binary frames
    it names) or raise."""
    if not parts:
        raise ProtocolError("runner message has no frames")
    size = max(len(p) for p in parts)  # per frame, as the socket's ZMQ_MAXMSGSIZE counts
    if size > max_bytes:
        raise ProtocolError(f"runner message frame of {size} bytes exceeds {max_bytes}")
    try:
        data = frames.loads(parts[0], parts[1:], parse_constant=_reject_constant)
    except frames.FrameError as exc:
        raise ProtocolError(f"runner message's binary frames do not match it: {exc}") from exc
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"runner frame is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ProtocolError(f"runner message must be a JSON object, got {type(data).__name__}")
    if not isinstance(data.get("type"), str):
        raise ProtocolError("runner message needs a string 'type'")
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")

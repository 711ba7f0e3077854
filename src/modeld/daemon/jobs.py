"""The daemon's records of requests and loaded models, and the views built from them.

Plain data used by :mod:`modeld.daemon.scheduler` (which owns and mutates them from the event loop)
and by the daemon's ``ps``/``load`` replies.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from modeld.cache.policy import CachePolicy, Entry, EvictionReason, ModelKey, parse_keep_alive
from modeld.config import Settings
from modeld.daemon import grammar, grammarproc, replycheck
from modeld.daemon.builds import Cancel
from modeld.daemon.supervisor import RunnerHandle
from modeld.model import ctx, placement
from modeld.model.modelinfo import ModelInfo
from modeld.model.placement import Placement
from modeld.wire import protocol, reqparse, requestfields
from modeld.wire import runnerwire as rp
from modeld.wire.messages import forces_call
from modeld.wire.replies import (
    DeviceShare,
    DoneBody,
    EmbedDone,
    GenerateDone,
    GenerateTimings,
    PooledTimings,
    PsRow,
    RerankDone,
    Usage,
)


@dataclass(eq=False, kw_only=True)
class Job:
    """One client request that needs a model (generate, embed or load)."""

    client: bytes  # ROUTER identity of the client
    rid: str  # the client's request id
    kind: str  # "generate" | "embed" | "rerank" | "load"
    key: ModelKey
    name: str
    payload: dict[str, Any] = field(default_factory=dict)  # runner message body (no rid)
    keep_alive_s: float | None = None
    n_ctx: int | None = None  # requested (or needed after context_exceeded)
    ctx_why: str | None = None  # why n_ctx was set by the daemon (a growth): its ctx_reason
    pinned: bool = False
    created: float = 0.0  # the scheduler's clock at submit
    runner_rid: str = ""
    waited_for_load: bool = False
    ctx_retries: int = 0
    # its prompt was re-sent to be counted (count_only): the loaded context it was refused in
    # by a bound from its bytes; the exact count then decides the growth (daemon/growth.py)
    counting: int | None = None
    cancel_sent: bool = False
    client_gone: bool = False
    parallel: int | None = None  # a load's own ``parallel`` (None: the setting)
    kv_unified: bool | None = None  # a load's own: one pool of cells shared (None: the config's)
    rpc: tuple[str, ...] | None = None  # llama.cpp RPC workers to load with (None: none)
    kv_cache_type: str | None = None  # a load's own KV cache type (None: the config's)
    gpu_layers: int | None = None  # a load's own GPU layers, -1 auto (None: the config's)
    rpc_check: Future[None] | None = None  # its workers asked HELLO before a reload onto them
    mmproj: str | None = None  # a load's own image projector ("": none; None: found)
    alone: bool = False  # greedy and deterministic: never batched with other sequences
    earlier: dict[str, Any] | None = None  # the runner's done of the reply's part so far
    check: replycheck.ReplyCheck | None = None  # a reply held to a schema: validated when done


@dataclass
class LoadAsked:
    """What explicit ``load`` requests set for a model (None: they did not say). It outlives
    the model's reloads (a context that grows, another ``parallel``) and goes when the model
    is unloaded for any other reason."""

    parallel: int | None = None
    kv_unified: bool | None = None
    n_ctx: int | None = None  # a floor: a reload never gives less
    keep_alive_s: float | None = None  # also what requests without their own get
    pinned: bool = False
    kv_cache_type: str | None = None
    gpu_layers: int | None = None
    mmproj: str | None = None

    def take(self, job: Job) -> None:
        """Remember what the ``load`` ``job`` set."""
        self.parallel = job.parallel if job.parallel is not None else self.parallel
        self.kv_unified = job.kv_unified if job.kv_unified is not None else self.kv_unified
        self.n_ctx = job.n_ctx if job.n_ctx is not None else self.n_ctx
        self.keep_alive_s = job.keep_alive_s if job.keep_alive_s is not None else \
            self.keep_alive_s
        self.pinned = self.pinned or job.pinned
        self.kv_cache_type = job.kv_cache_type or self.kv_cache_type
        self.gpu_layers = job.gpu_layers if job.gpu_layers is not None else self.gpu_layers
        self.mmproj = job.mmproj if job.mmproj is not None else self.mmproj


@dataclass(eq=False)
class Slot:
    """Daemon-side state of one cache entry: its runner, the requests it decodes now (up to
    ``parallel``, by runner rid) and its FIFO queue."""

    key: ModelKey
    name: str
    runner_id: str
    info: ModelInfo
    queue: deque[Job] = field(default_factory=deque)
    active: dict[str, Job] = field(default_factory=dict)
    parallel: int = 1  # in effect: what the runner's ``loaded`` reported (1 until then)
    planned_parallel: int = 1  # what the load asked the runner for
    parallel_reason: str = "one sequence"
    asked_parallel: int | None = None  # the load request's own value (a different one reloads)
    batch_invariant: bool = False  # the runner says batching never changes greedy tokens
    kv_unified: bool = False  # its sequences share one pool of n_ctx cells (planned, then the
    # runner's ``loaded``)
    retire: EvictionReason | None = None  # evict once idle (file changed, explicit unload)
    load_started: float = 0.0  # the scheduler's clock when its load was sent
    runner_pid: int | None = None
    draining: bool = False  # yielding to an older waiting load: new requests wait, not queue
    last_client: bytes | None = None  # who sent its latest request (see SWAP_GRACE_S)
    rpc: tuple[str, ...] = ()  # its llama.cpp RPC workers, leased to its runner
    devices: list[DeviceShare] = field(default_factory=list)  # from the runner's ``loaded``
    layers_offloaded: str | None = None
    kv_type: str = "f16"  # the KV cache type it was loaded with
    asked_kv_type: str | None = None  # the load request's own (another one reloads)
    mmproj: str | None = None  # the image projector loaded beside the model (issue 38)
    placement: Placement = field(default_factory=lambda: Placement(0, 0))  # layers planned
    vram_estimate: int = 0  # planned bytes on the GPUs
    vram_measured: int | None = None  # NVML's bytes of its runner (None: no NVML)
    progress_at: float = 0.0  # last message from its runner (the scheduler's clock)
    busy_since: float | None = None  # when its runner last started having requests
    rpc_stalled_s: float | None = None  # killed: no progress while its workers held it


@dataclass(eq=False)
class Waiting:
    """Requests for a model that is not loaded yet and has no room yet (or whose loaded
    model is draining to make room for an older waiting load)."""

    key: ModelKey
    name: str
    jobs: list[Job]
    deadline: float
    reason: str = ""
    need_bytes: int = 0  # what the last admission attempt needed
    for_baseline: bool = False  # only waiting for a starting runner's measured baseline


Send = Callable[[Job, protocol.Message], bool]


def keep_alive_of(value: str | int | float | None, settings: Settings) -> float | None:
    """A request's keep-alive in seconds; None when it did not set one.

    Per request, as in Ollama, but not sticky: a request without keep_alive gets the one an
    explicit ``load`` set, else the configured default (:meth:`Dispatch.keep_alive_for`), so
    one ``-1`` request does not pin the model for everyone after it and a plain request does
    not shorten what ``modeld load --keep-alive 1h`` asked for.
    """
    return None if value is None else parse_keep_alive(value, settings.keep_alive)


def requested_ctx(n_ctx: int | None) -> int | None:
    """A request's own n_ctx, rounded up as every context is (None: automatic)."""
    return None if n_ctx is None else ctx.round_up(n_ctx)


def needs_grammar(req: reqparse.GenerateRequest) -> bool:
    """Whether ``req``'s reply is held to a grammar (a format, a forced tool call)."""
    return not req.count_only and (req.format is not None
                                   or forces_call(req.tools, req.tool_choice))


def request_grammar(req: reqparse.GenerateRequest, key: ModelKey, settings: Settings,
                    cancel: Cancel | None = None) -> str | None:
    """``req``'s grammar, built and checked (raises InvalidRequestError): bounded, but slow
    enough to run off the event loop (:mod:`modeld.daemon.builds`), and a big one in a
    low-priority child (:mod:`modeld.daemon.grammarproc`), killed when ``cancel`` is set."""
    if not needs_grammar(req):
        return None
    family = grammar.family_of(key.path) if forces_call(req.tools, req.tool_choice) \
        else "generic"  # fmt: skip
    return grammarproc.for_request(req.format, req.tools, req.tool_choice, family,
                                   int(settings.max_grammar_bytes), cancel)


def request_job(
    client: bytes,
    rid: str,
    req: reqparse.GenerateRequest | reqparse.EmbedRequest | reqparse.RerankRequest,
    key: ModelKey,
    name: str,
    settings: Settings,
    gbnf: str | None = None,
) -> Job:
    """The job of a generate, embed or rerank request: its runner message, built by the runner
    protocol's own builders (the scheduler sets the runner's rid when it dispatches).
    ``gbnf``: the generate request's grammar (:func:`request_grammar`)."""
    if isinstance(req, reqparse.EmbedRequest):
        payload = rp.embed(rid, req.inputs)
        return Job(client=client, rid=rid, kind="embed", key=key, name=name, payload=payload,
                   keep_alive_s=keep_alive_of(req.keep_alive, settings),
                   n_ctx=requested_ctx(req.n_ctx), gpu_layers=req.gpu_layers)  # fmt: skip
    if isinstance(req, reqparse.RerankRequest):
        payload = rp.rerank(rid, req.query, req.documents, req.top_n)
        return Job(client=client, rid=rid, kind="rerank", key=key, name=name, payload=payload,
                   keep_alive_s=keep_alive_of(req.keep_alive, settings),
                   n_ctx=requested_ctx(req.n_ctx))  # fmt: skip
    o = req.options
    # The promise: a greedy reply does not depend on what else its model decodes.
    alone = o.sampling.greedy and o.deterministic is not False and not req.count_only
    asked = requestfields.asked(req)
    if req.tool_choice == "none":  # the model is not shown tools it may not call
        asked["tools"] = ()
    sampling = o.sampling
    if sampling.draft_max < 0:  # the request left it to the daemon's setting
        sampling = dataclasses.replace(sampling, draft_max=settings.draft_max)
    payload = rp.generate(rid, sampling=sampling, raw=o.raw, deterministic=alone,
                          grammar=gbnf, **asked)  # fmt: skip
    check = replycheck.for_request(req.format, req.tools, req.tool_choice) if gbnf else None
    return Job(client=client, rid=rid, kind="generate", key=key, name=name, payload=payload,
               keep_alive_s=keep_alive_of(o.keep_alive, settings), n_ctx=requested_ctx(o.n_ctx),
               alone=alone, gpu_layers=o.gpu_layers, check=check)  # fmt: skip


def done_body(
    slot: Slot, job: Job, entry: Entry | None, msg: Mapping[str, Any], now: float
) -> DoneBody:
    """The client's ``done`` for a runner's ``done``: usage, timings (with load_s) and result."""
    raw_usage = msg.get("usage")
    usage: Usage = raw_usage if isinstance(raw_usage, dict) else {}  # type: ignore[assignment]
    raw_timings = msg.get("timings")
    timings: dict[str, Any] = raw_timings if isinstance(raw_timings, dict) else {}
    completion = int(usage.get("completion_tokens", 0) or 0)
    prompt_tokens = int(usage.get("prompt_tokens", 0) or 0)
    load_s = float(entry.load_seconds or 0.0) if (entry and job.waited_for_load) else 0.0
    name, n_ctx = slot.name, (entry.n_ctx if entry else None)
    if job.kind in ("embed", "rerank"):
        pooled: PooledTimings = {**timings, "load_s": load_s,  # type: ignore[typeddict-item]
                                 "prompt_tokens": prompt_tokens}  # fmt: skip
        if job.kind == "embed":
            return EmbedDone(model=name, n_ctx=n_ctx, usage=usage,
                             embeddings=msg.get("embeddings", []), timings=pooled)  # fmt: skip
        return RerankDone(model=name, n_ctx=n_ctx, usage=usage,
                          results=msg.get("results", []), timings=pooled)  # fmt: skip
    done = GenerateDone(
        model=name,
        n_ctx=n_ctx,
        usage=usage,
        finish_reason=msg.get("finish_reason"),
        timings=GenerateTimings(
            load_s=load_s,
            prompt_eval_s=timings.get("prompt_eval_s", 0.0),
            generation_s=timings.get("generation_s", 0.0),
            tokens_per_s=timings.get("tokens_per_s", 0.0),
            batched_max=int(timings.get("batched_max", 1) or 1),
            draft_tokens=int(timings.get("draft_tokens", 0) or 0),
            draft_accepted=int(timings.get("draft_accepted", 0) or 0),
            prompt_tokens=prompt_tokens,
            prompt_tokens_reused=int(usage.get("prompt_tokens_reused", 0) or 0),
            completion_tokens=completion,
            total_s=now - job.created,
        ),
    )
    calls = msg.get("tool_calls")
    if isinstance(calls, list) and calls:
        done["tool_calls"] = calls
    if isinstance(msg.get("stop_sequence"), str):
        done["stop_sequence"] = msg["stop_sequence"]
    if isinstance(msg.get("length_reason"), str):
        done["length_reason"] = msg["length_reason"]
    return done


#: The runner's counts of prompt-lookup drafting in a ``done``'s timings (runner/speculate.py).
DRAFT_TIMINGS = ("draft_tokens", "draft_accepted", "draft_steps")


def joined(earlier: Mapping[str, Any], later: Mapping[str, Any]) -> dict[str, Any]:
    """One runner ``done`` for a reply written in parts (it grew its context in between): the
    prompt as the first part evaluated it, the reply's tokens as the last part counts them
    (all of them), the generation times added up."""
    def part(msg: Mapping[str, Any], name: str) -> dict[str, Any]:
        value = msg.get(name)
        return dict(value) if isinstance(value, dict) else {}

    first_usage, first_times = part(earlier, "usage"), part(earlier, "timings")
    usage, timings = part(later, "usage"), part(later, "timings")
    usage.update({k: first_usage[k] for k in ("prompt_tokens", "prompt_tokens_reused")
                  if k in first_usage})  # fmt: skip
    generation = float(first_times.get("generation_s", 0.0)) + float(
        timings.get("generation_s", 0.0)) + float(timings.get("prompt_eval_s", 0.0))
    timings.update(
        prompt_eval_s=first_times.get("prompt_eval_s", 0.0), generation_s=generation,
        tokens_per_s=int(usage.get("completion_tokens", 0)) / generation if generation else 0.0,
        batched_max=max(int(first_times.get("batched_max", 1)), int(timings.get("batched_max", 1))),
        **{k: int(first_times.get(k, 0)) + int(timings.get(k, 0)) for k in DRAFT_TIMINGS},
    )  # fmt: skip
    return {**later, "usage": usage, "timings": timings}


def add_gpu(out: PsRow, slot: Slot, entry: Entry) -> None:
    """A row's KV cache type and where its layers are: ``processor`` as ``ollama ps`` says it,
    ``size_vram`` what the cache charges the cards (NVML's bytes of its runner once measured,
    the plan until then), ``vram_measured`` (None: not yet), the plan, its layers, its reason."""
    p = slot.placement
    out["kv_cache_type"], out["processor"] = slot.kv_type, "100% CPU"
    out["gpu_layers"], out["size_vram"], out["n_layers"] = p.gpu_layers, 0, p.n_layers
    if p.gpu_layers > 0:
        out["processor"] = placement.processor(p.gpu_layers, p.n_layers)
        out["size_vram"] = sum(entry.accounted_vram)
        out["vram_measured"] = None if entry.vram_measured is None else sum(entry.vram_measured)
        out["vram_estimate"], out["vram_per_gpu"] = slot.vram_estimate, list(p.vram)
        out["layers"] = placement.describe(p, slot.kv_type)["layers"]
        out["gpu_reason"] = p.reason


def _parallel_reason(slot: Slot | None) -> str | None:
    if slot is None:
        return None
    why = slot.parallel_reason
    if slot.parallel != slot.planned_parallel:
        why = f"{slot.parallel} in effect (the runner's), {slot.planned_parallel} planned: {why}"
    if slot.kv_unified and slot.parallel > 1:
        why += "; one pool of n_ctx cells shared (kv_unified)"
    if not slot.batch_invariant and slot.parallel > 1:
        why += "; deterministic greedy requests run alone"
    return why


def ps_rows(
    cache: CachePolicy,
    slots: Mapping[ModelKey, Slot],
    waiting: Mapping[ModelKey, Waiting],
    runners: Mapping[str, RunnerHandle],
    now: float,
) -> list[PsRow]:
    """One row per cache entry (loading, ready, unloading) and per model waiting for room."""
    wall = time.time()
    rows: list[PsRow] = []
    for entry in cache.entries():
        slot = slots.get(entry.key)
        d: dict[str, Any] = entry.to_dict(now)
        keep = entry.keep_alive_s
        runner = runners.get(entry.runner_id)
        rows.append({
            "name": slot.name if slot else entry.key.name,
            "path": entry.key.path,
            "mode": entry.key.mode,
            "state": d["state"],
            "n_ctx": entry.n_ctx,
            "ctx_reason": entry.ctx_reason,
            "parallel": slot.parallel if slot else None,
            "kv_unified": bool(slot and slot.kv_unified and slot.parallel > 1),
            "parallel_reason": _parallel_reason(slot),
            "measured_bytes": entry.measured_bytes,
            "estimate_bytes": entry.estimate_bytes,
            "accounted_bytes": entry.accounted_bytes,
            "in_flight": entry.in_flight,
            "queued": len(slot.queue) if slot else 0,
            "use_count": entry.use_count,
            "last_used": wall - (now - entry.last_used),
            "keep_alive_s": None if math.isinf(keep) else keep,
            "keep_alive_left_s": d["expires_in_s"],
            "forever": math.isinf(keep),
            "pinned": entry.pinned,
            "runner_id": entry.runner_id,
            "runner_pid": runner.pid if runner else None,
            "load_seconds": entry.load_seconds,
            "retiring": slot.retire.value if slot and slot.retire else None,
            "last_unload_reason": d["last_unload_reason"],
        })  # fmt: skip
        if slot is not None:
            add_gpu(rows[-1], slot, entry)
        if slot is not None and slot.rpc:
            rows[-1]["rpc"] = list(slot.rpc)
            rows[-1]["devices"] = list(slot.devices)
            if slot.layers_offloaded:
                rows[-1]["layers_offloaded"] = slot.layers_offloaded
    for w in waiting.values():  # a model waiting for room: nothing of it is loaded yet
        rows.append({
            "name": w.name, "path": w.key.path, "mode": w.key.mode, "state": "waiting",
            "n_ctx": None, "ctx_reason": w.reason, "parallel": None, "kv_unified": False,
            "parallel_reason": None,
            "measured_bytes": None, "estimate_bytes": None, "accounted_bytes": 0,
            "in_flight": 0, "queued": len(w.jobs), "use_count": 0, "last_used": None,
            "keep_alive_s": None, "keep_alive_left_s": None, "forever": False, "pinned": False,
            "runner_id": None, "runner_pid": None, "load_seconds": None, "retiring": None,
            "last_unload_reason": None,
        })  # fmt: skip
    return rows

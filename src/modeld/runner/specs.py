"""What a runner is asked to do, validated: the daemon's ``load``, ``generate``, ``embed`` and
``rerank`` messages (built by :mod:`modeld.wire.runnerwire`) parsed into typed specs.

Why separate: building and encoding serve both ends; validation is the receiving runner's
job, and its errors name the field so a daemon bug is obvious.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modeld.wire import loadfields, options, requestfields
from modeld.wire.loadfields import LoadSpec as LoadSpec  # declared there, read here
from modeld.wire.messages import forces_call
from modeld.wire.options import Sampling
from modeld.wire.protocol import ProtocolError
from modeld.wire.requestfields import Asked, Decided

#: Streamed text is sent at most this often per sequence (the first piece at once). Each message
#: wakes the daemon and the client; on 2 cores one per token cost ~3% of the decode rate because
#: they preempt llama.cpp's threads (bench streaming: 0.96-0.97 of in-process, 0.985 coalesced).
CHUNK_INTERVAL_S = 0.04
#: The same for a request whose client reads the reply whole (``stream`` false: HTTP
#: ``"stream": false``): nobody reads the pieces, so they only wake the daemon (on RPC workers
#: the 40 ms chunks cost up to 8% of the decode rate: docs/benchmarks.md). One a second still
#: tells the daemon the request progresses (its stall watch on RPC workers: runner_stall_s).
QUIET_INTERVAL_S = 1.0


@dataclass(frozen=True, kw_only=True)
class GenerateSpec(Asked, Decided):
    """A runner's generate request: what the client asked and the daemon decided (their fields
    declared in :mod:`modeld.wire.requestfields`), its sampling and the daemon's ``rid``."""

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
    return loadfields.parse(msg, lambda text: ProtocolError(f"load: {text}"))


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

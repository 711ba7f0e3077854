"""What a runner is asked to do, validated: the daemon's ``load``, ``generate``, ``embed`` and
``rerank`` messages (built by :mod:`modeld.runner.protocol`) parsed into typed specs.

Why separate: building and encoding serve both ends; validation is the receiving runner's
job, and its errors name the field so a daemon bug is obvious.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modeld.protocol import MAX_PARALLEL, MODES, ProtocolError
from modeld.runner.promptcache import PROMPT_CACHE_MIB


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


@dataclass(frozen=True)
class GenerateSpec:
    rid: str
    prompt: str | None
    messages: tuple[dict[str, str], ...] | None
    raw: bool
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: tuple[str, ...]
    n_threads: int | None = None  # this request's CPU threads (the daemon shares the cores)


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
    )


def parse_generate(msg: Mapping[str, Any]) -> GenerateSpec:
    rid = _str(msg, "rid")
    prompt = msg.get("prompt")
    messages = msg.get("messages")
    if (prompt is None) == (messages is None):
        raise ProtocolError("generate: give exactly one of 'prompt' or 'messages'")
    if prompt is not None and not isinstance(prompt, str):
        raise ProtocolError("generate: 'prompt' must be a string")
    parsed_messages: tuple[dict[str, str], ...] | None = None
    if messages is not None:
        if not (
            isinstance(messages, list)
            and messages
            and all(
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            raise ProtocolError("generate: 'messages' must be a non-empty list of {role, content}")
        parsed_messages = tuple({"role": m["role"], "content": m["content"]} for m in messages)
    stop = msg.get("stop", [])
    if isinstance(stop, str):
        stop = [stop]
    if not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise ProtocolError("generate: 'stop' must be a list of non-empty strings")
    raw = msg.get("raw", False)
    if not isinstance(raw, bool):
        raise ProtocolError("generate: 'raw' must be a boolean")
    return GenerateSpec(
        rid=rid,
        prompt=prompt,
        messages=parsed_messages,
        raw=raw,
        max_tokens=_int(msg, "max_tokens", 1, 1 << 24, 256),
        temperature=_float(msg, "temperature", 0.0, 100.0, 0.8),
        top_p=_float(msg, "top_p", 0.0, 1.0, 0.95),
        top_k=_int(msg, "top_k", 0, 1 << 24, 40),
        seed=_int(msg, "seed", -(1 << 31), (1 << 32) - 1, 0),
        stop=tuple(stop),
        n_threads=_int(msg, "n_threads", 0, 1024, 0) or None,
    )


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


def _float(msg: Mapping[str, Any], key: str, lo: float, hi: float, default: float) -> float:
    value = msg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"{msg.get('type')}: {key!r} must be a number")
    if not (math.isfinite(value) and lo <= value <= hi):
        raise ProtocolError(f"{msg.get('type')}: {key!r} must be in [{lo}, {hi}]")
    return float(value)

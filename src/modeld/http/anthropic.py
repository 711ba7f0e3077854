"""Anthropic's Messages API on modeld (``POST /v1/messages``, ``/v1/messages/count_tokens``):
what Claude Code speaks. Requests are translated by :mod:`modeld.http.anthropicreq` onto the
same generate request as every other API; replies come back as content blocks (``thinking``,
``text``, ``tool_use``) or as Anthropic's event stream. The query string (Claude Code sends
``?beta=true``) and the ``anthropic-version``/``anthropic-beta`` headers change nothing.

``usage.input_tokens`` counts the prompt tokens evaluated for this request and
``cache_read_input_tokens`` those reused from the runner's prompt cache (their sum is the
prompt), as Anthropic reports its own prompt caching.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from modeld.errors import ErrorCode, ModeldError
from modeld.http.anthropicreq import messages_generate, one_call
from modeld.http.common import (
    API,
    message_of,
    read_json,
    status_of,
    validation_of,
)
from modeld.http.reply import Renderer, generation
from modeld.wire.textcheck import parse_json

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
          503: "overloaded_error", 529: "overloaded_error"}  # fmt: skip


def error(exc: ModeldError) -> JSONResponse:
    """``{"type": "error", "error": {"type", "message"}}`` with the status modeld gives it."""
    status = status_of(exc)
    if exc.code == ErrorCode.CANCELLED:
        status = 400
    kind = _TYPES.get(status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message_of(exc)}},
                        status_code=status)


def _usage(done: dict[str, Any]) -> dict[str, int]:
    t = done.get("timings", {})
    prompt, reused = int(t.get("prompt_tokens") or 0), int(t.get("prompt_tokens_reused") or 0)
    return {"input_tokens": prompt - reused, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": reused,
            "output_tokens": int(t.get("completion_tokens") or 0)}  # fmt: skip


def _stop(done: dict[str, Any], stops: list[str]) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence``: the runner names the stop string it met."""
    reason = done.get("finish_reason")
    if reason == "length" and done.get("length_reason") == "context_window":
        return "model_context_window_exceeded", None  # as Anthropic says it, not max_tokens
    if reason == "length":
        return "max_tokens", None
    if reason == "tool_calls":
        return "tool_use", None
    hit = done.get("stop_sequence")
    if isinstance(hit, str) and hit in stops:
        return "stop_sequence", hit
    return "end_turn", None


def _input(arguments: str) -> dict[str, Any]:
    value = parse_json(arguments, "tool_use.input") if arguments.strip() else {}
    return value if isinstance(value, dict) else {}


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return (f"event: {kind}\ndata: ".encode() + json.dumps(data, separators=(",", ":")).encode()
            + b"\n\n")


class _Blocks:
    """The streamed content blocks: one open at a time; thinking, text and each tool call
    open their own (``content_block_start`` … ``content_block_stop``)."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "thinking" | "text" | "tool_use:<call index>"

    def _switch(self, key: str, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open = key
        out.append(_sse("content_block_start", {"type": "content_block_start",
                                                "index": self.index, "content_block": block}))
        return out

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [_sse("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                            "delta": delta})

    def chunk(self, body: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        thinking = str(body.get("thinking") or "")
        if thinking:
            if self.open != "thinking":
                out += self._switch("thinking", {"type": "thinking", "thinking": "",
                                                 "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": thinking}))
        text = str(body.get("text") or "")
        if text:
            if self.open != "text":
                out += self._switch("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": text}))
        for d in body.get("tool_calls") or []:
            key = f"tool_use:{d['index']}"
            if "name" in d:
                out += self._switch(key, {"type": "tool_use", "id": d["id"], "name": d["name"],
                                          "input": {}})
            if d.get("arguments") and self.open == key:
                out.append(self._delta({"type": "input_json_delta",
                                        "partial_json": d["arguments"]}))
        return out


#: Anthropic's keep-alive event.
_PING = _sse("ping", {"type": "ping"})


class _Message(Renderer):
    """A reply as Anthropic's message: content blocks, or its event stream (``message_start``
    and a ``ping``, the blocks' events, ``message_delta``, ``message_stop``)."""

    def __init__(self, doc: dict[str, Any], body: dict[str, Any]) -> None:
        self.name, self.one_call = str(doc.get("model") or "default"), one_call(doc)
        self.ident = f"msg_{uuid.uuid4().hex[:24]}"
        self.stops = list(body["options"].get("stop") or [])
        if isinstance(doc.get("stop_sequences"), str):
            self.stops = [doc["stop_sequences"]]
        self.blocks = _Blocks()

    def head(self) -> list[bytes]:
        return [_sse("message_start", {"type": "message_start", "message": {
            "id": self.ident, "type": "message", "role": "assistant", "model": self.name,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}}), _PING]

    def tick(self) -> bytes:
        return _PING

    def chunk(self, body: dict[str, Any]) -> list[bytes]:
        return self.blocks.chunk(body)

    def done(self, text: str, done: dict[str, Any]) -> list[bytes]:
        reason, hit = _stop(done, self.stops)
        return [*self.blocks.close(), _sse("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": hit, **validation_of(done)},
            "usage": _usage(done)}), _sse("message_stop", {"type": "message_stop"})]

    def error(self, exc: ModeldError) -> list[bytes]:
        return [_sse("error", {"type": "error", "error": {
            "type": _TYPES.get(status_of(exc), "api_error"), "message": message_of(exc)}})]

    def whole(self, text: str, done: dict[str, Any]) -> Response:
        content: list[dict[str, Any]] = []
        if done.get("thinking"):
            content.append({"type": "thinking", "thinking": done["thinking"], "signature": ""})
        if text:
            content.append({"type": "text", "text": text})
        for c in done.get("tool_calls") or []:
            content.append({"type": "tool_use", "id": c["id"], "name": c["name"],
                            "input": _input(c["arguments"])})
        reason, hit = _stop(done, self.stops)
        return JSONResponse({"id": self.ident, "type": "message", "role": "assistant",
                             "model": self.name, "content": content, "stop_reason": reason,
                             "stop_sequence": hit, "usage": _usage(done),
                             **validation_of(done)})

    def http_error(self, exc: ModeldError) -> Response:
        return error(exc)


class AnthropicAPI(API):

    def routes(self) -> list[Route]:
        return [
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
        ]

    async def count_tokens(self, request: Request) -> Response:
        """The prompt's tokens by the model's own tokenizer and template (tools and system
        included): the runner builds the prompt as for a reply and counts it, evaluating
        nothing (``count_only``, docs/protocol.md)."""
        try:
            doc = await read_json(request, self.limit)
            body = messages_generate(doc, count=True)
            if body.pop("tool_choice", None) == "none":  # the only choice that changes the
                body.pop("tools", None)  # prompt: the tools are not shown
            done = await self.bridge.call("generate", model=self.model(doc.get("model")),
                                          count_only=True, **body)
        except ModeldError as exc:
            return error(exc)
        return JSONResponse({"input_tokens": int(done["timings"]["prompt_tokens"])})

    async def messages(self, request: Request) -> Response:
        try:
            doc = await read_json(request, self.limit)
            body = messages_generate(doc)
        except ModeldError as exc:
            return error(exc)
        return await generation(self.bridge, {"model": self.model(doc.get("model")), **body},
                                _Message(doc, body), bool(doc.get("stream")))

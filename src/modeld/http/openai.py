"""OpenAI's API (``/v1/*``) on modeld: chat and text completions (server-sent events ending in
``[DONE]``, or one JSON document with ``usage``), embeddings (``encoding_format`` ``float`` or
``base64`` — the official SDK asks for base64 by default: ollama#6934), llama-server's rerank
(``/v1/rerank``, ``/rerank``) and the model list.
``keep_alive`` is accepted here too (ollama#9355)."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from modeld.describe import list_models
from modeld.errors import ErrorCode, InvalidRequestError, ModeldError
from modeld.http.chatreq import openai_generate
from modeld.http.common import (
    API,
    UNLIMITED,
    headers_of,
    input_list,
    message_of,
    read_json,
    status_of,
    validation_of,
)
from modeld.http.reply import Renderer, generation

#: The SSE event that ends every stream (OpenAI's SDK reads to it).
_DONE = b"data: [DONE]\n\n"
_TYPES = {ErrorCode.MODEL_NOT_FOUND: "not_found_error", ErrorCode.INVALID_REQUEST:
          "invalid_request_error", ErrorCode.CONTEXT_EXCEEDED: "invalid_request_error",
          ErrorCode.INVALID_MODEL: "invalid_request_error"}  # fmt: skip


def error(exc: ModeldError) -> JSONResponse:
    status = status_of(exc)
    kind = _TYPES.get(exc.code, "server_error" if status >= 500 else "invalid_request_error")
    return JSONResponse({"error": {"message": message_of(exc), "type": kind, "param": None,
                                   "code": exc.code.value}}, status_code=status,
                        headers=headers_of(exc))


def _usage(done: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's usage, with the prompt tokens read from the prompt cache as OpenAI (and
    llama-server) report them: ``prompt_tokens_details.cached_tokens``."""
    t = done.get("timings", {})
    prompt, completion = int(t.get("prompt_tokens") or 0), int(t.get("completion_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": int(t.get("prompt_tokens_reused") or 0)}}


def _finish(done: dict[str, Any]) -> str:
    reason = done.get("finish_reason")
    return str(reason) if reason in ("length", "tool_calls") else "stop"


def _why(done: dict[str, Any]) -> dict[str, str]:
    """A ``length`` choice's ``length_reason`` (modeld's: ``max_tokens`` or
    ``context_window``), so a client can tell a full context from its own limit."""
    reason = done.get("length_reason")
    return {"length_reason": str(reason)} if done.get("finish_reason") == "length" and reason \
        else {}


class _Completion(Renderer):
    """A chat or text completion in OpenAI's shapes: one document with ``usage``, or chunks as
    SSE ``data`` events ending in ``[DONE]``."""

    def __init__(self, doc: dict[str, Any], body: dict[str, Any], chat: bool) -> None:
        self.chat, self.one_call = chat, doc.get("parallel_tool_calls") is False
        self.want_logprobs = bool(body["options"].get("logprobs"))
        self.name = str(doc.get("model") or "default")
        self.ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.include_usage = bool((doc.get("stream_options") or {}).get("include_usage"))

    def _calls(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]

    def _deltas(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for d in deltas:
            item: dict[str, Any] = {"index": d["index"]}
            fn: dict[str, Any] = {"arguments": d.get("arguments", "")}
            if "name" in d:
                item.update(id=d["id"], type="function")
                fn["name"] = d["name"]
            item["function"] = fn
            out.append(item)
        return out

    def _logprobs(self, entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        if entries is None or not self.want_logprobs:
            return None
        if self.chat:
            return {"content": entries}
        return {"tokens": [e["token"] for e in entries],
                "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e.get("top_logprobs", [])}
                                 for e in entries]}  # fmt: skip

    def _message(self, text: str, done: dict[str, Any]) -> dict[str, Any]:
        calls = self._calls(done.get("tool_calls") or [])
        msg: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
        if done.get("thinking"):
            msg["reasoning_content"] = done["thinking"]
        if calls:
            msg["tool_calls"] = calls
        return msg

    def _delta(self, body: dict[str, Any]) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant"}
        if body.get("thinking"):
            delta["reasoning_content"] = body["thinking"]
        if body.get("text") or not (body.get("thinking") or body.get("tool_calls")):
            delta["content"] = str(body.get("text", ""))
        calls = self._deltas(body.get("tool_calls") or [])
        if calls:
            delta["tool_calls"] = calls
        return delta

    def _choice(self, body: dict[str, Any] | None, finish: str | None,
                logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
        lp = self._logprobs(logprobs)
        if self.chat:
            return {"index": 0, "delta": {} if body is None else self._delta(body),
                    "logprobs": lp, "finish_reason": finish}
        text = "" if body is None else str(body.get("text", ""))
        return {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}

    def _event(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None
               ) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        payload: dict[str, Any] = {"id": self.ident, "object": kind, "created": self.created,
                                   "model": self.name, "choices": choices}
        if usage is not None:
            payload["usage"] = usage
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    def chunk(self, body: dict[str, Any]) -> list[bytes]:
        return [self._event([self._choice(body, None, body.get("logprobs") or [])])]

    def done(self, text: str, done: dict[str, Any]) -> list[bytes]:
        out = [self._event([{**self._choice(None, _finish(done), None), **_why(done),
                             **validation_of(done)}])]
        if self.include_usage:
            out.append(self._event([], _usage(done)))
        return [*out, _DONE]

    def error(self, exc: ModeldError) -> list[bytes]:
        err = {"error": {"message": message_of(exc), "code": exc.code.value}}
        return [b"data: " + json.dumps(err).encode() + b"\n\n", _DONE]

    def whole(self, text: str, done: dict[str, Any]) -> Response:
        one: dict[str, Any] = {"index": 0}
        one.update({"message": self._message(text, done)} if self.chat else {"text": text})
        one.update(logprobs=self._logprobs(done.get("logprobs")), finish_reason=_finish(done),
                   **_why(done), **validation_of(done))
        return JSONResponse({"id": self.ident, "object": "chat.completion" if self.chat else
                             "text_completion", "created": self.created, "model": self.name,
                             "choices": [one], "usage": _usage(done)})

    def http_error(self, exc: ModeldError) -> Response:
        return error(exc)


class OpenAIAPI(API):

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
            # llama-server's rerank API (also what Jina and Cohere clients send)
            Route("/v1/rerank", self.rerank, methods=["POST"]),
            Route("/rerank", self.rerank, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
        ]

    async def chat(self, request: Request) -> Response:
        try:
            doc = await read_json(request, self.limit)
            body = openai_generate(doc, chat=True)
            body["options"].setdefault("max_tokens", UNLIMITED)
        except ModeldError as exc:
            return error(exc)
        return await self._complete(doc, body, chat=True)

    async def completions(self, request: Request) -> Response:
        try:
            doc = await read_json(request, self.limit)
            prompt = doc.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if not isinstance(prompt, str):
                raise InvalidRequestError("'prompt' must be a string",
                                          hint="send one prompt per request")
            body = openai_generate(doc, chat=False)
            if body.keys() & {"tools", "tool_choice"}:
                raise InvalidRequestError("tools need /v1/chat/completions",
                                          hint="send messages to /v1/chat/completions")
            body["options"].setdefault("max_tokens", 16)  # the API's documented default
            body["options"]["raw"] = True
            body["prompt"] = prompt
        except ModeldError as exc:
            return error(exc)
        return await self._complete(doc, body, chat=False)

    async def _complete(self, doc: dict[str, Any], body: dict[str, Any], chat: bool
                        ) -> Response:
        return await generation(self.bridge, {"model": self.model(doc.get("model")), **body},
                                _Completion(doc, body, chat), bool(doc.get("stream")))

    async def embeddings(self, request: Request) -> Response:
        try:
            doc = await read_json(request, self.limit)
            hint = "token arrays are not accepted; send text"
            inputs = input_list(doc, hint)
            if not all(isinstance(i, str) for i in inputs):
                raise InvalidRequestError("'input' must be a string or a list of strings",
                                          hint=hint)
            fmt = doc.get("encoding_format") or "float"
            if fmt not in ("float", "base64"):
                raise InvalidRequestError(f"encoding_format {fmt!r} is not supported",
                                          hint='use "float" or "base64"')
            body = await self.bridge.call("embed", model=self.model(doc.get("model")),
                                          inputs=inputs, keep_alive=doc.get("keep_alive"))
        except ModeldError as exc:
            return error(exc)
        data = []
        for i, vec in enumerate(body["embeddings"]):
            value: Any = vec
            if fmt == "base64":  # little-endian float32, as the SDK decodes it
                value = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = int(body.get("timings", {}).get("prompt_tokens") or 0)
        return JSONResponse({"object": "list", "data": data,
                             "model": str(doc.get("model") or "default"),
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def rerank(self, request: Request) -> Response:
        """``query`` and ``documents`` (or ``texts``) -> ``results`` of ``index`` and
        ``relevance_score``, best first, the ``top_n`` best (default: all), as llama-server
        answers; ``return_documents`` adds each ``document`` ({"text"}) as Jina and Cohere do."""
        try:
            doc = await read_json(request, self.limit)
            query, docs = doc.get("query"), doc.get("documents", doc.get("texts"))
            if not isinstance(query, str):
                raise InvalidRequestError("'query' must be a string", hint="send the query text")
            if not (isinstance(docs, list) and docs and all(isinstance(d, str) for d in docs)):
                raise InvalidRequestError("'documents' must be a non-empty list of strings",
                                          hint="send the texts to score as 'documents'")
            top_n = doc.get("top_n")
            if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)
                                      or top_n < 1):
                raise InvalidRequestError("'top_n' must be a positive integer")
            body = await self.bridge.call(
                "rerank", model=self.model(doc.get("model")), query=query, documents=docs,
                top_n=min(top_n or len(docs), len(docs)), keep_alive=doc.get("keep_alive"),
            )  # fmt: skip
        except ModeldError as exc:
            return error(exc)
        results = [dict(r) for r in body["results"]]
        if doc.get("return_documents"):
            for r in results:
                r["document"] = {"text": docs[int(r["index"])]}
        tokens = int(body.get("timings", {}).get("prompt_tokens") or 0)
        return JSONResponse({"model": str(doc.get("model") or "default"), "object": "list",
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                             "results": results})

    async def models(self, request: Request) -> Response:
        """The models, each with ``context_length`` (the context it has or would get now)
        and ``max_context_length`` (what a long prompt can grow it to), as the daemon plans
        them; a model whose file is not there yet (the default before its first use) or
        that cannot be read lists without them."""
        listed = await asyncio.to_thread(list_models, self.settings)
        rows = [m for m in listed["models"]]
        shows = await asyncio.gather(*(self._context(m) for m in rows))
        return JSONResponse({"object": "list", "data": [
            {"id": str(m["name"]), "object": "model", "created": 0, "owned_by": "modeld",
             **show} for m, show in zip(rows, shows, strict=True)]})

    async def _context(self, row: dict[str, Any]) -> dict[str, int]:
        if not row.get("architecture"):
            return {}
        try:
            body = await self.bridge.call("show", model=self.model(str(row["name"])))
        except ModeldError:
            return {}
        out = {"context_length": body.get("n_ctx"), "max_context_length": body.get("n_ctx_max")}
        return {k: int(v) for k, v in out.items() if isinstance(v, int)}

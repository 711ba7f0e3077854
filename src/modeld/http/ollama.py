"""Ollama's API (``/api/*``) on modeld: the requests the ``ollama`` client, Open WebUI and
editor plugins send, with Ollama's conventions (NDJSON streams, nanosecond durations, an empty
prompt loads the model, ``keep_alive: 0`` unloads it, ``name:tag`` model names)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from modeld import __version__
from modeld.describe import list_models
from modeld.errors import InvalidRequestError, ModeldError
from modeld.http.chatreq import ollama_generate, ollama_messages, ollama_tool_calls
from modeld.http.common import (
    API,
    UNLIMITED,
    headers_of,
    input_list,
    iso_now,
    iso_time,
    message_of,
    read_json,
    status_of,
    validation_of,
)
from modeld.http.imageparts import ollama_images
from modeld.http.reply import Renderer, generation, ndjson
from modeld.model.gguf import read_chat_template
from modeld.replyparse import template_capabilities
from modeld.wire import options

#: Ollama's ``options`` -> modeld's: the sampling table's Ollama names, the context and the
#: layers on the GPUs (``num_gpu``; -1 as Ollama: as many as fit).
OPTIONS = {**options.api_fields("ollama"), "num_ctx": "n_ctx", "num_gpu": "gpu_layers"}
NS = 1_000_000_000


def error(exc: ModeldError) -> JSONResponse:
    return JSONResponse({"error": message_of(exc)}, status_code=status_of(exc),
                        headers=headers_of(exc))


def _options(doc: dict[str, Any]) -> dict[str, Any]:
    """modeld options from Ollama's ``options`` (an unknown one is a 400 naming it) and the
    top-level ``keep_alive``, ``logprobs`` and ``top_logprobs``. ``num_predict`` -1 (or
    left out) is Ollama's "no limit": until the end of the text or of the context."""
    opts = doc.get("options") or {}
    if not isinstance(opts, dict):
        raise InvalidRequestError("'options' must be an object", hint="see Ollama's API docs")
    for key in opts:
        if key not in OPTIONS:
            raise InvalidRequestError(f"the option {key!r} is not supported by modeld",
                                      hint="supported: " + ", ".join(sorted(OPTIONS)))
    out = {OPTIONS[k]: v for k, v in opts.items() if v is not None}
    limit = out.get("max_tokens")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit <= 0:
        if limit not in (-1, -2):
            raise InvalidRequestError("'num_predict' must be positive, or -1 for no limit",
                                      hint="0 would generate nothing")
        out["max_tokens"] = UNLIMITED
    out.setdefault("max_tokens", UNLIMITED)
    for key in ("logprobs", "top_logprobs"):
        if doc.get(key) is not None:
            out[key] = doc[key]
    if doc.get("keep_alive") is not None:
        out["keep_alive"] = doc["keep_alive"]
    return out


def _done_record(name: str, body: dict[str, Any], started: float) -> dict[str, Any]:
    t = body.get("timings", {})
    load_s = float(t.get("load_s") or 0.0)
    return {
        "model": name, "created_at": iso_now(), "done": True,
        "done_reason": "length" if body.get("finish_reason") == "length" else "stop",
        "total_duration": int((time.monotonic() - started) * NS),
        "load_duration": int(load_s * NS),
        "prompt_eval_count": int(t.get("prompt_tokens") or 0),
        "prompt_eval_duration": int(float(t.get("prompt_eval_s") or 0.0) * NS),
        "eval_count": int(t.get("completion_tokens") or 0),
        "eval_duration": int(float(t.get("generation_s") or 0.0) * NS),
        **validation_of(body),
    }  # fmt: skip


class _Generation(Renderer):
    """A generation in Ollama's shapes: NDJSON records (``message`` for a chat, ``response``
    for a prompt), the last with ``done`` and its timings, or that last record alone."""

    media_type = "application/x-ndjson"
    ticks = False  # Ollama's stream sends nothing before its first token

    def __init__(self, doc: dict[str, Any], field: str) -> None:
        self.name, self.field = str(doc.get("model") or "default"), field
        self.started = time.monotonic()

    def _piece(self, text: str, parts: dict[str, Any]) -> dict[str, Any]:
        if self.field == "message":
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if parts.get("thinking"):
                msg["thinking"] = parts["thinking"]
            calls = parts.get("calls_done", parts.get("tool_calls"))
            if calls:
                msg["tool_calls"] = ollama_tool_calls(calls)
            out = {"model": self.name, "created_at": iso_now(), "message": msg, "done": False}
        else:
            out = {"model": self.name, "created_at": iso_now(), "response": text,
                   "done": False}
            if parts.get("thinking"):
                out["thinking"] = parts["thinking"]
        if parts.get("logprobs"):
            out["logprobs"] = parts["logprobs"]
        return out

    def chunk(self, body: dict[str, Any]) -> list[bytes]:
        parts = {k: body[k] for k in ("thinking", "calls_done", "logprobs") if body.get(k)}
        return [ndjson(self._piece(str(body.get("text", "")), parts))]

    def done(self, text: str, done: dict[str, Any]) -> list[bytes]:
        return [ndjson({**self._piece("", {}), **_done_record(self.name, done, self.started)})]

    def error(self, exc: ModeldError) -> list[bytes]:
        return [ndjson({"error": message_of(exc)})]  # mid-stream: Ollama's way

    def whole(self, text: str, done: dict[str, Any]) -> Response:
        record = self._piece(text, done)
        record.update(_done_record(self.name, done, self.started))
        if self.field == "response":
            record["context"] = []
        return JSONResponse(record)

    def http_error(self, exc: ModeldError) -> Response:
        return error(exc)


class OllamaAPI(API):

    def routes(self) -> list[Route]:
        return [
            Route("/", self.root, methods=["GET", "HEAD"]),
            Route("/api/version", self.version, methods=["GET"]),
            Route("/api/generate", self.generate, methods=["POST"]),
            Route("/api/chat", self.chat, methods=["POST"]),
            Route("/api/embed", self.embed, methods=["POST"]),
            Route("/api/embeddings", self.embeddings, methods=["POST"]),
            Route("/api/tags", self.tags, methods=["GET"]),
            Route("/api/ps", self.ps, methods=["GET"]),
            Route("/api/show", self.show, methods=["POST"]),
        ]

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": __version__})

    # ------------------------------------------------------------------ generation

    async def generate(self, request: Request) -> Response:
        try:
            doc = await read_json(request, self.limit)
            ref = self.model(doc.get("model"))
            prompt = doc.get("prompt") or ""
            if not isinstance(prompt, str):
                raise InvalidRequestError("'prompt' must be a string", hint="send text")
            body = ollama_generate(doc)
            images = ollama_images(doc.get("images"), "images")
            if not prompt and not doc.get("system") and not images:
                return await self._load_or_unload(doc, ref, "response")
            body["options"] = _options(doc)
            if doc.get("raw"):
                body["prompt"] = prompt
                body["options"]["raw"] = True
                if images:
                    body["images"] = images
            else:
                messages = [{"role": "system", "content": str(doc["system"])}] \
                    if doc.get("system") else []
                user: dict[str, Any] = {"role": "user", "content": prompt}
                if images:
                    user["images"] = images
                messages.append(user)
                body["messages"] = messages
        except ModeldError as exc:
            return error(exc)
        return await self._generation(doc, ref, body, "response")

    async def chat(self, request: Request) -> Response:
        try:
            doc = await read_json(request, self.limit)
            ref = self.model(doc.get("model"))
            body = ollama_generate(doc)
            if doc.get("images"):
                raise InvalidRequestError("'images' goes on a message in /api/chat",
                                          hint='send {"role": "user", "content": …, '
                                          '"images": […]}')  # fmt: skip
            messages = ollama_messages(doc.get("messages") or [])
            if not messages:
                return await self._load_or_unload(doc, ref, "message")
            body.update(messages=messages, options=_options(doc))
        except ModeldError as exc:
            return error(exc)
        return await self._generation(doc, ref, body, "message")

    async def _generation(self, doc: dict[str, Any], ref: str | None, body: dict[str, Any],
                          field: str) -> Response:
        return await generation(self.bridge, {"model": ref, **body}, _Generation(doc, field),
                                doc.get("stream") is not False)

    async def _load_or_unload(self, doc: dict[str, Any], ref: str | None, field: str
                              ) -> Response:
        """Ollama: an empty prompt loads the model; with ``keep_alive: 0`` it unloads it."""
        name = str(doc.get("model") or "default")
        body: Any = {"role": "assistant", "content": ""} if field == "message" else ""
        unload = doc.get("keep_alive") in (0, "0", "0s", "0m")
        try:
            if unload:
                await self.bridge.call("unload", model=ref or "default")
            else:
                await self.bridge.call("load", model=ref, mode="generate",
                                       keep_alive=doc.get("keep_alive"))
        except ModeldError as exc:
            if not (unload and exc.code == "model_not_found" and "not loaded" in exc.message):
                return error(exc)
        return JSONResponse({"model": name, "created_at": iso_now(), field: body, "done": True,
                             "done_reason": "unload" if unload else "load"})

    # ------------------------------------------------------------------ embeddings

    async def embed(self, request: Request) -> Response:
        try:
            doc = await read_json(request, self.limit)
            inputs = input_list(doc, "send text to embed")
            started = time.monotonic()
            opts = doc.get("options") or {}
            body = await self.bridge.call(
                "embed", model=self.model(doc.get("model")), inputs=[str(i) for i in inputs],
                keep_alive=doc.get("keep_alive"),
                n_ctx=opts.get("num_ctx") if isinstance(opts, dict) else None,
                gpu_layers=opts.get("num_gpu") if isinstance(opts, dict) else None)
        except ModeldError as exc:
            return error(exc)
        t = body.get("timings", {})
        return JSONResponse({
            "model": str(doc.get("model") or "default"), "embeddings": body["embeddings"],
            "total_duration": int((time.monotonic() - started) * NS),
            "load_duration": int(float(t.get("load_s") or 0.0) * NS),
            "prompt_eval_count": int(t.get("prompt_tokens") or 0),
        })

    async def embeddings(self, request: Request) -> Response:
        """The older single-text endpoint: ``prompt`` in, ``embedding`` out."""
        try:
            doc = await read_json(request, self.limit)
            body = await self.bridge.call(
                "embed", model=self.model(doc.get("model")), inputs=[str(doc.get("prompt", ""))],
                keep_alive=doc.get("keep_alive"))
        except ModeldError as exc:
            return error(exc)
        return JSONResponse({"embedding": body["embeddings"][0]})

    # ------------------------------------------------------------------ inventory

    async def tags(self, request: Request) -> Response:
        listed = await asyncio.to_thread(list_models, self.settings)
        return JSONResponse({"models": [_tag(m) for m in listed["models"]]})

    async def ps(self, request: Request) -> Response:
        try:
            body = await self.bridge.call("ps")
        except ModeldError as exc:
            return error(exc)
        models = []
        for row in body.get("models", []):
            if row.get("state") not in ("ready", "busy", "loading"):
                continue  # every mode, as `modeld ps` shows them
            left = row.get("keep_alive_left_s")
            expires = time.time() + (left if isinstance(left, (int, float)) else 10 * 365 * 86400)
            name = str(row.get("name"))
            vram = int(row.get("size_vram") or 0)  # NVML's bytes of its runner (Ollama: size
            models.append({  # is the whole model, size_vram its part on the GPUs)
                "name": name, "model": name,
                "size": int(row.get("accounted_bytes") or 0) + vram,
                "digest": _digest(str(row.get("path"))), "details": _details(row),
                "expires_at": iso_time(expires), "size_vram": vram,
                "context_length": row.get("n_ctx"),
            })  # fmt: skip
        return JSONResponse({"models": models})

    async def show(self, request: Request) -> Response:
        try:
            doc = await read_json(request, self.limit)
            name = doc.get("model") or doc.get("name")
            body = await self.bridge.call("show", model=self.model(name), mode="generate")
        except ModeldError as exc:
            return error(exc)
        info = body.get("info", {})
        model_info = {f"general.{k}": v for k, v in info.items()
                      if isinstance(v, (str, int, float, bool))}
        if info.get("architecture") and info.get("context_length"):  # where Ollama puts it
            model_info[f"{info['architecture']}.context_length"] = info["context_length"]
        n_ctx = body.get("n_ctx")
        return JSONResponse({
            "license": "", "modelfile": "",
            "parameters": f"num_ctx {n_ctx}" if isinstance(n_ctx, int) else "",
            "template": "", "details": _details(info), "model_info": model_info,
            "capabilities": await asyncio.to_thread(_capabilities, body),
            "modeld": {k: body.get(k) for k in ("n_ctx", "n_ctx_max", "ctx_reason",
                                               "estimate_bytes", "fits", "plan", "plan_reason",
                                               "would_evict")},
        })  # fmt: skip


def _capabilities(show: dict[str, Any]) -> list[str]:
    """What the model can do here, as Ollama names it: completion (a generative model; every
    one can call tools: natively when its template knows tools, else shown them as text and
    answering in JSON, or forced by a grammar), thinking when its template thinks, embedding
    for a pooling model, vision when it has an image projector."""
    info = show.get("info", {})
    if info.get("pooling_type"):
        return ["embedding"]
    caps = ["completion", "tools"]
    if show.get("mmproj"):  # an image projector beside it or set for it (issue 38)
        caps.append("vision")
    try:
        template = read_chat_template(str(show.get("path")))
    except (OSError, ValueError):
        template = None
    if "thinking" in template_capabilities(template):
        caps.append("thinking")
    return caps


def _digest(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()


def _details(src: dict[str, Any]) -> dict[str, Any]:
    arch = src.get("architecture")
    return {"format": "gguf", "family": arch or "", "families": [arch] if arch else None,
            "parameter_size": str(src.get("size_label") or ""),
            "quantization_level": str(src.get("quantization") or "")}


def _tag(m: dict[str, Any]) -> dict[str, Any]:
    from modeld.pull.store import tag_of  # a pulled model: its hub name and real SHA-256

    name, digest = tag_of(str(m.get("path")), str(m.get("name")))
    modified = 0.0
    with contextlib.suppress(OSError):
        modified = os.stat(str(m.get("path"))).st_mtime
    return {"name": name, "model": name, "modified_at": iso_time(modified),
            "size": int(m.get("size") or 0), "digest": digest or _digest(str(m.get("path"))),
            "details": _details(m)}

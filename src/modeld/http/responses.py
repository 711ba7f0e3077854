"""OpenAI's Responses API on modeld (``POST /v1/responses``): what Codex CLI speaks. Requests
are translated by :mod:`modeld.http.responsesreq`; replies are a ``response`` object whose
``output`` holds ``reasoning``, ``message`` and ``function_call`` items, or the Responses event
stream (``response.created`` … ``response.completed``, every event with its
``sequence_number``). ``previous_response_id`` continues a stored response (the last
:data:`~modeld.http.responsesreq.STORE_SIZE`, in memory); an unknown one is a 400.

``usage.input_tokens`` is the whole prompt and ``input_tokens_details.cached_tokens`` the part
the runner's prompt cache supplied, as OpenAI reports it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from modeld.config import Settings
from modeld.errors import InvalidRequestError, ModeldError
from modeld.http.bridge import Bridge
from modeld.http.common import (
    API,
    message_of,
    read_json,
    validation_of,
)
from modeld.http.openai import error
from modeld.http.reply import Renderer, generation
from modeld.http.responsesreq import ResponseStore, reply_message, responses_generate


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _usage(done: dict[str, Any]) -> dict[str, Any]:
    t = done.get("timings", {})
    prompt, completion = int(t.get("prompt_tokens") or 0), int(t.get("completion_tokens") or 0)
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": int(t.get("prompt_tokens_reused") or 0)},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}  # fmt: skip


class _Items:
    """The reply's output items as they stream: one open at a time (reasoning, message, or
    one function call), each announced, filled by deltas and closed with its whole form."""

    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []  # closed items, in order
        self.item: dict[str, Any] | None = None  # the open one
        self.key = ""  # "reasoning" | "message" | "call:<index>"
        self.text: list[str] = []
        self.seq = 0

    def event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

    @property
    def index(self) -> int:
        return len(self.done)

    def _open(self, key: str, item: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.key, self.item, self.text = key, item, []
        out.append(self.event("response.output_item.added", output_index=self.index,
                              item=item))
        if item["type"] == "message":
            out.append(self.event("response.content_part.added", item_id=item["id"],
                                  output_index=self.index, content_index=0,
                                  part={"type": "output_text", "text": "", "annotations": []}))
        return out

    def close(self, status: str = "completed") -> list[bytes]:
        """Close the open item; ``status`` ``incomplete`` when the reply was cut there."""
        item = self.item
        if item is None:
            return []
        text, where = "".join(self.text), {"item_id": item["id"], "output_index": self.index}
        out = []
        if item["type"] == "reasoning":
            out.append(self.event("response.reasoning_text.done", **where, content_index=0,
                                  text=text))
            item = {**item, "content": [{"type": "reasoning_text", "text": text}]}
        elif item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            out.append(self.event("response.output_text.done", **where, content_index=0,
                                  text=text, logprobs=[]))
            out.append(self.event("response.content_part.done", **where, content_index=0,
                                  part=part))
            item = {**item, "status": status, "content": [part]}
        else:
            out.append(self.event("response.function_call_arguments.done", **where,
                                  name=item["name"], arguments=text))
            item = {**item, "status": status, "arguments": text}
        out.append(self.event("response.output_item.done", output_index=self.index, item=item))
        self.done.append(item)
        self.item = None
        return out

    def chunk(self, body: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if body.get("thinking"):
            if self.key != "reasoning" or self.item is None:
                out += self._open("reasoning", {"type": "reasoning", "id": _id("rs"),
                                                "summary": [], "content": []})
            out += self._delta("response.reasoning_text.delta", str(body["thinking"]), True)
        if body.get("text"):
            if self.key != "message" or self.item is None:
                out += self._open("message", {"type": "message", "id": _id("msg"),
                                              "status": "in_progress", "role": "assistant",
                                              "content": []})
            out += self._delta("response.output_text.delta", str(body["text"]), True)
        for d in body.get("tool_calls") or []:
            key = f"call:{d['index']}"
            if "name" in d:
                out += self._open(key, {"type": "function_call", "id": _id("fc"),
                                        "call_id": d["id"], "name": d["name"], "arguments": "",
                                        "status": "in_progress"})
            if d.get("arguments") and self.key == key and self.item is not None:
                out += self._delta("response.function_call_arguments.delta", d["arguments"])
        return out

    def _delta(self, kind: str, text: str, indexed: bool = False) -> list[bytes]:
        assert self.item is not None
        self.text.append(text)
        extra: dict[str, Any] = {"content_index": 0} if indexed else {}
        if kind == "response.output_text.delta":
            extra["logprobs"] = []
        return [self.event(kind, item_id=self.item["id"], output_index=self.index, delta=text,
                           **extra)]


def _incomplete(done: dict[str, Any]) -> dict[str, str] | None:
    """``incomplete_details`` of a reply cut short: by ``max_output_tokens``, or by the end of
    the model's loaded context (``context_window``, modeld's reason), else None."""
    if done.get("finish_reason") != "length":
        return None
    full = done.get("length_reason") == "context_window"
    return {"reason": "context_window" if full else "max_output_tokens"}


def _whole(text: str, done: dict[str, Any]) -> list[dict[str, Any]]:
    """The output items of a reply read to its end (the last one ``incomplete`` when the
    reply was cut, as the response says)."""
    out: list[dict[str, Any]] = []
    if done.get("thinking"):
        out.append({"type": "reasoning", "id": _id("rs"), "summary": [],
                    "content": [{"type": "reasoning_text", "text": done["thinking"]}]})
    if text:
        out.append({"type": "message", "id": _id("msg"), "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]})
    for c in done.get("tool_calls") or []:
        out.append({"type": "function_call", "id": _id("fc"), "call_id": c["id"],
                    "name": c["name"], "arguments": c["arguments"], "status": "completed"})
    if out and _incomplete(done) and "status" in out[-1]:
        out[-1]["status"] = "incomplete"
    return out


class _Response(Renderer):
    """A reply as a Responses ``response`` object, or its event stream; a finished reply is
    stored for ``previous_response_id`` unless the request says ``store`` false."""

    def __init__(self, doc: dict[str, Any], previous: str | None,
                 conversation: list[dict[str, Any]], store: ResponseStore) -> None:
        self.doc, self.previous, self.conversation = doc, previous, conversation
        self.store = store if doc.get("store") is not False else None
        self.one_call = doc.get("parallel_tool_calls") is False
        self.ident, self.created = _id("resp"), int(time.time())
        self.items = _Items()

    def _response(self, status: str, output: list[dict[str, Any]],
                  usage: dict[str, Any] | None, incomplete: dict[str, str] | None = None
                  ) -> dict[str, Any]:
        doc = self.doc
        return {
            "id": self.ident, "object": "response", "created_at": self.created,
            "status": status, "model": str(doc.get("model") or "default"), "output": output,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": doc.get("instructions"),
            "max_output_tokens": doc.get("max_output_tokens"),
            "parallel_tool_calls": not self.one_call,
            "previous_response_id": self.previous, "store": self.store is not None,
            "temperature": doc.get("temperature"), "top_p": doc.get("top_p"),
            "tool_choice": doc.get("tool_choice", "auto"), "tools": doc.get("tools", []),
            "text": doc.get("text", {"format": {"type": "text"}}),
            "metadata": doc.get("metadata") or {}, "usage": usage,
        }  # fmt: skip

    def _finish(self, text: str, done: dict[str, Any], output: list[dict[str, Any]]
                ) -> dict[str, Any]:
        if self.store is not None:
            self.store.put(self.ident, [*self.conversation, reply_message(text, done)])
        cut = _incomplete(done)
        return {**self._response("incomplete" if cut else "completed", output, _usage(done),
                                 cut), **validation_of(done)}

    def head(self) -> list[bytes]:
        head = self._response("in_progress", [], None)
        return [self.items.event("response.created", response=head),
                self.items.event("response.in_progress", response=head)]

    def chunk(self, body: dict[str, Any]) -> list[bytes]:
        return self.items.chunk(body)

    def done(self, text: str, done: dict[str, Any]) -> list[bytes]:
        out = self.items.close("incomplete" if _incomplete(done) else "completed")
        # "completed" ends every stream (the SDK's and Codex's readers wait for it); a reply
        # cut at max_output_tokens says so in its status.
        final = self._finish(text, done, self.items.done)
        return [*out, self.items.event("response.completed", response=final)]

    def error(self, exc: ModeldError) -> list[bytes]:
        return [self.items.event("error", code=exc.code.value, message=message_of(exc),
                                 param=None)]

    def whole(self, text: str, done: dict[str, Any]) -> Response:
        return JSONResponse(self._finish(text, done, _whole(text, done)))

    def http_error(self, exc: ModeldError) -> Response:
        return error(exc)


class ResponsesAPI(API):

    def __init__(self, bridge: Bridge, settings: Settings) -> None:
        super().__init__(bridge, settings)
        self.store = ResponseStore()

    def routes(self) -> list[Route]:
        return [Route("/v1/responses", self.create, methods=["POST"])]

    async def create(self, request: Request) -> Response:
        try:
            doc = await read_json(request, self.limit)
            previous = doc.get("previous_response_id")
            if previous is not None and not isinstance(previous, str):
                raise InvalidRequestError("'previous_response_id' must be a string")
            history = self.store.get(previous) if previous else []
            body, conversation = responses_generate(doc, history)
        except ModeldError as exc:
            return error(exc)
        return await generation(
            self.bridge, {"model": self.model(doc.get("model")), **body},
            _Response(doc, previous, conversation, self.store), bool(doc.get("stream")))

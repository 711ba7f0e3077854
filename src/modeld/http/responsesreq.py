"""OpenAI's Responses API (what Codex CLI speaks since it dropped chat completions) translated
into modeld's generate request, and the bounded store ``previous_response_id`` continues from.

Every field is honoured or refused with a 400 naming it, except those that change nothing a
local model does (storage, routing and accounting at OpenAI: ``metadata``, ``user``,
``prompt_cache_key``, ``service_tier`` …). Mapping:

- ``instructions`` → a system message first (not carried into a continuation, as at OpenAI);
- ``input``: a string (one user message) or items: messages (``input_text``/``output_text``
  parts; ``developer`` is ``system``), ``function_call`` → the assistant's ``tool_calls``,
  ``function_call_output`` → a ``tool`` message, ``reasoning`` → the thinking of the
  assistant turn that follows;
- ``tools``: function tools; other types (``web_search``, ``local_shell``, Codex's
  ``namespace`` …) are run by OpenAI's servers or the client and are skipped, as Codex needs;
- ``tool_choice``, ``text.format`` (``json_schema``/``json_object``), ``max_output_tokens``,
  ``temperature``, ``top_p``, ``reasoning.effort`` (``none`` → thinking off, others on).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from modeld.errors import InvalidRequestError
from modeld.http.chatreq import refuse_unknown, tool_list, unanswered_call
from modeld.http.imageparts import Content
from modeld.wire import options

FIELDS = frozenset({
    "model", "input", "instructions", "tools", "tool_choice", "text", "max_output_tokens",
    "stream", "previous_response_id", "store", "metadata", "user", "parallel_tool_calls",
    "reasoning", "include", "truncation", "service_tier", "prompt_cache_key",
    "prompt_cache_retention", "safety_identifier", "stream_options", "background",
    "max_tool_calls", "keep_alive", "client_metadata",
})  # fmt: skip
#: Responses a ``previous_response_id`` may name (the most recent; older ones are forgotten).
STORE_SIZE = 64



def _bad(text: str) -> InvalidRequestError:
    return InvalidRequestError(text, hint="see docs/protocol.md (OpenAI Responses API)")


class ResponseStore:
    """The conversations of recent responses (wire messages, the reply included), by id:
    what a ``previous_response_id`` continues from. Bounded: the oldest go first."""

    def __init__(self, size: int = STORE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def put(self, ident: str, messages: list[dict[str, Any]]) -> None:
        self._items[ident] = messages
        self._items.move_to_end(ident)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def get(self, ident: str) -> list[dict[str, Any]]:
        if ident not in self._items:
            raise _bad(f"'previous_response_id' {ident!r} is not known: modeld keeps the last "
                       f"{self.size} stored responses in memory, since its start")
        return list(self._items[ident])


def responses_generate(doc: Mapping[str, Any], history: list[dict[str, Any]]
                       ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(a protocol generate body, the conversation without ``instructions``: what a later
    ``previous_response_id`` continues from). ``history``: the previous response's."""
    refuse_unknown(doc, FIELDS | {"temperature", "top_p"}, "responses")
    if doc.get("background"):
        raise _bad("'background' is not supported: modeld answers while you wait")
    conversation = history + input_messages(doc.get("input", []), history)
    if not any(m["role"] != "system" for m in conversation):
        # Codex probes a provider with an empty input: answered as an empty user turn
        conversation.append({"role": "user", "content": ""})
    instructions = doc.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("'instructions' must be a string")
    system = [{"role": "system", "content": instructions}] if instructions else []
    body: dict[str, Any] = {"messages": system + conversation}
    opts: dict[str, Any] = {}
    for ours, theirs in (("max_tokens", "max_output_tokens"), ("temperature", "temperature"),
                         ("top_p", "top_p")):  # fmt: skip
        if doc.get(theirs) is not None:
            opts[ours] = doc[theirs]
    limit = doc.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise _bad("'max_output_tokens' must be a positive integer")
    opts.setdefault("max_tokens", options.MAX_TOKENS)
    body["options"] = opts
    tools = _tools(doc.get("tools"))
    if tools:
        body["tools"] = tools
    choice = _tool_choice(doc.get("tool_choice"))
    if choice is not None:
        body["tool_choice"] = choice
    fmt = _format(doc.get("text"))
    if fmt is not None:
        body["format"] = fmt
    reasoning = doc.get("reasoning")
    if reasoning is not None:
        effort = reasoning.get("effort") if isinstance(reasoning, dict) else "?"
        if effort not in (None, "none", "minimal", "low", "medium", "high", "xhigh"):
            raise _bad("'reasoning.effort' must be none, minimal, low, medium, high or xhigh")
        if effort is not None:
            body["think"] = effort != "none"
    if doc.get("parallel_tool_calls") not in (None, True, False):
        raise _bad("'parallel_tool_calls' must be true or false")
    return body, conversation


def input_messages(raw: Any, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``input`` as wire messages (see the module docstring)."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise _bad("'input' must be a string or a list of items")
    names = {c["id"]: c["name"] for m in history for c in m.get("tool_calls", []) if "id" in c}
    out: list[dict[str, Any]] = []
    thinking = ""
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            role = "system" if role == "developer" else role
            if role not in ("system", "user", "assistant"):
                raise _bad(f"{where}.role must be user, assistant, system or developer")
            msg: dict[str, Any] = _parts(item.get("content"), where).message(role)
            if role == "assistant" and thinking:
                msg["thinking"], thinking = thinking, ""
            out.append(msg)
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise _bad(f"{where} needs 'call_id' and 'name'")
            args = item.get("arguments", "{}")
            if not isinstance(args, str):
                raise _bad(f"{where}.arguments must be JSON text")
            names[call_id] = name
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant":  # calls join the assistant turn
                last = {"role": "assistant", "content": ""}
                out.append(last)
            if thinking:
                last["thinking"], thinking = thinking, ""
            last.setdefault("tool_calls", []).append(
                {"id": call_id, "name": name, "arguments": args or "{}"})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise _bad(f"{where}.call_id must be the call_id of a function_call")
            if call_id not in names:  # OpenAI: "No tool call found for function call output"
                raise unanswered_call(f"{where}.call_id", call_id, "a function_call item "
                                      "before it (or in the previous_response_id's)")
            out.append({"role": "tool", "tool_call_id": call_id, "tool_name": names[call_id],
                        "content": _content(item.get("output"), where, "output")})
        elif kind == "reasoning":
            parts = (item.get("content") or []) + (item.get("summary") or [])
            texts = [p.get("text") for p in parts if isinstance(p, dict)]
            thinking += "".join(t for t in texts if isinstance(t, str))
        else:
            raise _bad(f"{where}: input items of type {kind!r} are not supported "
                       "(message, function_call, function_call_output, reasoning)")
    return out


def _parts(content: Any, where: str, name: str = "content") -> Content:
    """A message's content parts: text, and ``input_image`` (its ``image_url`` a data URI)."""
    out = Content()
    if isinstance(content, str):
        out.text(content)
        return out
    if not isinstance(content, list):
        raise _bad(f"{where}.{name} must be a string or a list of content parts")
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            out.text(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.text(part["refusal"])
        elif kind == "input_image":
            if part.get("file_id") is not None:
                raise _bad(f"{where}.{name}[{j}].file_id: modeld stores no files; send the "
                           "image as a data: URI in image_url")
            out.url(part.get("image_url"), f"{where}.{name}[{j}].image_url")
        else:
            raise _bad(f"{where}.{name}[{j}]: parts of type {kind!r} are not supported")
    return out


def _content(content: Any, where: str, name: str = "content") -> str:
    """Text only (a tool's output): an image there is refused by name."""
    parts = _parts(content, where, name)
    if parts.images:
        raise _bad(f"{where}.{name} holds an image: modeld takes images in messages only")
    return "".join(parts.texts)


def _tools(value: Any) -> list[dict[str, Any]]:
    """Function tools; hosted or client-run ones (web_search, local_shell, namespace …) are
    left out, as Codex needs."""
    return tool_list(value, keep=lambda t: t.get("type") == "function", schema_key="parameters")


def _tool_choice(value: Any) -> str | dict[str, str] | None:
    if value is None or value in ("auto", "none", "required"):
        return value  # type: ignore[no-any-return]
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(
            value.get("name"), str):
        return {"name": value["name"]}
    raise _bad("'tool_choice' must be auto, none, required or "
               '{"type": "function", "name": …}')


def _format(text: Any) -> str | dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise _bad("'text' must be an object")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise _bad("'text.format.schema' must be a JSON Schema object")
        return schema
    raise _bad("'text.format.type' must be text, json_object or json_schema")


def reply_message(text: str, done: Mapping[str, Any]) -> dict[str, Any]:
    """The reply as a wire message, for the store."""
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if done.get("thinking"):
        msg["thinking"] = done["thinking"]
    calls = done.get("tool_calls") or []
    if calls:
        msg["tool_calls"] = [{"id": c["id"], "name": c["name"],
                              "arguments": c["arguments"]} for c in calls]  # fmt: skip
    return msg

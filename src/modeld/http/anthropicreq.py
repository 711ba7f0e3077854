"""Anthropic's Messages API (what Claude Code speaks) translated into modeld's generate request.

Every known field is honoured or refused with a 400 naming it; unknown fields and ``metadata``
are ignored, as Anthropic's own API does with fields a model has no use for (Claude Code sends
``context_management``, ``output_config``, ``cache_control`` …). Mapping:

- ``system`` (string or text blocks) and any ``role: "system"`` message inside ``messages``
  (Claude Code ≥ 2.1.154 sends them: vllm#44000, ollama#16372) become one system message, in
  order; lines that change every request and mean nothing to a model (Claude Code's
  ``x-anthropic-billing-header: …cch=…`` stamp) are dropped so the prompt cache still matches
  the next turn (ollama PR #14918, llama.cpp's billing-header normalisation).
- ``tool_use`` blocks → the assistant's ``tool_calls``; ``tool_result`` → a ``tool`` message
  answering that call (``is_error`` → its text starts with ``Error:``), and, as at Anthropic,
  a 400 unless the previous message made that call; ``thinking`` blocks → the assistant's
  ``thinking``; ``redacted_thinking`` is opaque (encrypted by Anthropic) and skipped.
- ``document`` blocks with a text source (``text`` or ``content``) → their title, context and
  text in the user's text; a PDF source and ``citations`` are refused.
- ``tools[].input_schema`` → the tool's parameters; server tools (a ``type`` other than
  ``custom``: web search, code execution …) run at Anthropic, not here, and are skipped.
- ``tool_choice`` auto/any/tool/none → auto/required/{name}/none; ``disable_parallel_tool_use``
  keeps the first call only (see :func:`one_call`).
- ``thinking`` enabled → thinking on, disabled → off, adaptive → the model's default;
  ``budget_tokens`` is checked but not enforced apart: thinking counts toward ``max_tokens``.
- ``output_config.format`` (``json_schema``) → the reply follows that schema.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from modeld.errors import InvalidRequestError
from modeld.http.chatreq import tool_list, unanswered_call
from modeld.http.imageparts import Content, anthropic_source

#: The lines of a system prompt dropped before templating: they change every request and
#: carry nothing for the model (Claude Code's per-request billing stamp).
VOLATILE_LINE = re.compile(r"^\s*x-anthropic-billing-header:.*$\n?", re.MULTILINE)



def _bad(text: str) -> InvalidRequestError:
    return InvalidRequestError(text, hint="see docs/protocol.md (Anthropic Messages API)")


def drop_volatile_lines(text: str) -> str:
    """``text`` without the lines of :data:`VOLATILE_LINE`."""
    return VOLATILE_LINE.sub("", text)


def messages_generate(doc: Mapping[str, Any], count: bool = False) -> dict[str, Any]:
    """A protocol generate body for a Messages request (``count``: a count_tokens body, which
    has no ``max_tokens``)."""
    body: dict[str, Any] = {}
    system = _system_text(doc.get("system"), "system")
    msgs: list[dict[str, Any]] = []
    raw = doc.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list")
    names: dict[str, str] = {}  # tool_use id -> tool name: the previous message's calls
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"{where} must be an object")
        role = m.get("role")
        if role == "system":  # tolerated: folded into the system prompt, in order
            extra = _system_text(m.get("content"), f"{where}.content")
            system = f"{system}\n\n{extra}" if system and extra else system or extra
        elif role == "user":
            msgs.extend(_user(m.get("content"), where, names))
            names = {}
        elif role == "assistant":
            names = {}
            msgs.append(_assistant(m.get("content"), where, names))
        else:
            raise _bad(f"{where}.role must be user or assistant (got {role!r})")
    if not msgs:
        raise _bad("'messages' has no user or assistant message")
    if msgs[-1]["role"] == "assistant" and not count:
        raise _bad("the last message is the assistant's: continuing a prefilled reply is not "
                   "supported by modeld (it would be answered as a finished turn)")
    body["messages"] = ([{"role": "system", "content": system}] if system else []) + msgs
    opts: dict[str, Any] = {}
    if not count:
        max_tokens = doc.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise _bad("'max_tokens' is required: a positive integer")
        opts["max_tokens"] = max_tokens
        for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"),
                             ("top_k", "top_k"), ("stop", "stop_sequences")):  # fmt: skip
            if doc.get(theirs) is not None:
                opts[ours] = doc[theirs]
        temperature = doc.get("temperature")
        if isinstance(temperature, int | float) and not 0 <= temperature <= 1:
            raise _bad("'temperature' must be in [0, 1]")
    body["options"] = opts
    tools = _tools(doc.get("tools"))
    if tools:
        body["tools"] = tools
    choice = _tool_choice(doc.get("tool_choice"), bool(tools))
    if choice is not None:
        body["tool_choice"] = choice
    think = _thinking(doc.get("thinking"))
    if think is not None:
        body["think"] = think
    fmt = _output_format(doc.get("output_config"))
    if fmt is not None:
        body["format"] = fmt
    return body


def one_call(doc: Mapping[str, Any]) -> bool:
    """Whether the reply may carry one tool call only (``disable_parallel_tool_use``)."""
    choice = doc.get("tool_choice")
    return isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True


def _system_text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return drop_volatile_lines(value).strip("\n")
    if not isinstance(value, list):
        raise _bad(f"'{where}' must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(
                block.get("text"), str):
            raise _bad(f"{where}[{j}] must be a text block")
        text = drop_volatile_lines(block["text"]).strip("\n")
        if text:
            texts.append(text)
    return "\n\n".join(texts)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _bad(f"{where}.content[{j}] must be a content block with a 'type'")
    return content


def _text_of(block: Mapping[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"{where}.text must be a string")
    return text


def _refuse_block(kind: str, where: str) -> InvalidRequestError:
    if kind == "image":
        return _bad(f"{where} is an image block: modeld takes images in user turns' "
                    "content")
    return _bad(f"{where}: content blocks of type {kind!r} are not supported here")


def _document(block: Mapping[str, Any], where: str) -> str:
    """A ``document`` block with a text source (``text``, or ``content`` of text blocks) as
    the text the model reads: its ``title`` and ``context`` first, as Anthropic's API reads
    them; a PDF (``base64``, ``url``, ``file``) is refused, and so are citations."""
    citations = block.get("citations")
    if isinstance(citations, dict) and citations.get("enabled"):
        raise _bad(f"{where}.citations: citations are not supported by modeld (a local model "
                   "does not cite passages); leave citations off")
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "text" and isinstance(source, dict):
        text = source.get("data")
        if not isinstance(text, str):
            raise _bad(f"{where}.source.data must be the document's text")
    elif kind == "content" and isinstance(source, dict):
        inner = source.get("content")
        if isinstance(inner, str):
            text = inner
        elif isinstance(inner, list):
            parts = []
            for k, part in enumerate(inner):
                at = f"{where}.source.content[{k}]"
                kind_k = part.get("type") if isinstance(part, dict) else None
                if kind_k != "text" or not isinstance(part, dict):
                    raise _refuse_block(str(kind_k), at)
                parts.append(_text_of(part, at))
            text = "\n\n".join(parts)
        else:
            raise _bad(f"{where}.source.content must be a string or a list of text blocks")
    else:
        raise _bad(f"{where} is a document of source type {kind!r}: modeld reads only text "
                   "documents (source type 'text' or 'content'), no PDF; send the document's "
                   "text instead")
    head = [v for v in (block.get("title"), block.get("context")) if isinstance(v, str) and v]
    return "\n\n".join([*head, text])


def _user(content: Any, where: str, names: Mapping[str, str]) -> list[dict[str, Any]]:
    """A user turn: its tool results as ``tool`` messages and its text as a user message,
    in the order they came."""
    out: list[dict[str, Any]] = []
    text = Content()

    def flush() -> None:
        nonlocal text
        if text.texts or text.images:
            out.append(text.message("user"))
            text = Content()

    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}.content[{j}]"
        kind = block["type"]
        if kind in ("text", "document"):
            if text.texts:
                text.text("\n\n")
            text.text(_text_of(block, at) if kind == "text" else _document(block, at))
        elif kind == "image":  # base64 only: a URL source is refused by name
            text.image(anthropic_source(block.get("source"), at), f"{at}.source.data")
        elif kind == "tool_result":
            flush()
            out.append(_tool_result(block, at, names))
        else:
            raise _refuse_block(kind, at)
    flush()
    return out


def _tool_result(block: Mapping[str, Any], where: str, names: Mapping[str, str]
                 ) -> dict[str, Any]:
    """A ``tool_result`` as a ``tool`` message; it must answer a ``tool_use`` of the previous
    message (``names``: its calls), as Anthropic's API requires."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.tool_use_id must be the id of a tool_use block")
    if call_id not in names:
        raise unanswered_call(f"{where}.tool_use_id", call_id,
                              "a tool_use block in the previous message")
    content = block.get("content", "")
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            at = f"{where}.content[{k}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "document" and isinstance(part, dict):
                parts.append(_document(part, at))
                continue
            if kind != "text" or not isinstance(part, dict):
                raise _refuse_block(str(kind), at)
            parts.append(_text_of(part, at))
        content = "\n\n".join(parts)
    if not isinstance(content, str):
        raise _bad(f"{where}.content must be a string or a list of text blocks")
    is_error = block.get("is_error")
    if is_error not in (None, True, False):
        raise _bad(f"{where}.is_error must be true or false")
    if is_error:
        content = f"Error: {content}"
    return {"role": "tool", "content": content, "tool_call_id": call_id,
            "tool_name": names[call_id]}


def _assistant(content: Any, where: str, names: dict[str, str]) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}.content[{j}]"
        kind = block["type"]
        if kind == "text":
            texts.append(_text_of(block, at))
        elif kind == "thinking":
            value = block.get("thinking")
            if not isinstance(value, str):
                raise _bad(f"{at}.thinking must be a string")
            thinking.append(value)
        elif kind == "redacted_thinking":
            continue  # encrypted by Anthropic: nothing a local model can read
        elif kind == "tool_use":
            name, call_id, args = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(name, str) or not name:
                raise _bad(f"{at}.name must be the tool's name")
            if not isinstance(args, dict):
                raise _bad(f"{at}.input must be an object")
            call: dict[str, Any] = {"name": name, "arguments": args}
            if isinstance(call_id, str) and call_id:
                call["id"] = call_id
                names[call_id] = name
            calls.append(call)
        else:
            raise _refuse_block(kind, at)
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        msg["thinking"] = "".join(thinking)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _tools(value: Any) -> list[dict[str, Any]]:
    """Client tools; a server tool (web search, code execution) is Anthropic's to run: left out."""
    return tool_list(value, keep=lambda t: t.get("type") in (None, "custom"),
                     schema_key="input_schema")


def _tool_choice(value: Any, has_tools: bool) -> str | dict[str, str] | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "none":
        return "none"
    if kind == "any":
        if not has_tools:
            raise _bad("'tool_choice' is 'any' but no 'tools' were given")
        return "required"
    if kind == "tool":
        name = value.get("name")
        if not isinstance(name, str):
            raise _bad("'tool_choice.name' must name one of 'tools'")
        return {"name": name}
    raise _bad("'tool_choice.type' must be auto, any, tool or none")


def _output_format(config: Any) -> dict[str, Any] | None:
    """``output_config.format`` (structured output) → a JSON Schema the reply must satisfy;
    ``output_config.effort`` is a hint for Anthropic's models and changes nothing here."""
    if not isinstance(config, dict) or config.get("format") is None:
        return None
    fmt = config["format"]
    schema = fmt.get("schema") if isinstance(fmt, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(
            schema, dict):
        raise _bad("'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {…}}")
    return schema


def _thinking(value: Any) -> bool | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "enabled":
        budget = value.get("budget_tokens")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                                   or budget < 1):
            raise _bad("'thinking.budget_tokens' must be a positive integer")
        return True
    if kind == "disabled":
        return False
    if kind == "adaptive":
        return None
    raise _bad("'thinking.type' must be enabled, disabled or adaptive")

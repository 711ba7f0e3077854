"""A chat request's typed parts: messages (with tool calls, tool results and thinking), the
tools a model may call, the tool choice and the output format.

One shape end to end: the HTTP layers translate their API's fields into it, the client
protocol carries it (``to_wire``/``parse_*``), the daemon checks it, and the runner renders it
into the chat template (:func:`template_messages`). Pure: no native imports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modeld.errors import InvalidRequestError
from modeld.wire.images import check_count, parse_list
from modeld.wire.textcheck import parse_json

ROLES = ("system", "user", "assistant", "tool")
CHOICES = ("auto", "none", "required")
#: Most tools one request may declare (a bound on the grammar the daemon builds).
MAX_TOOLS = 128
#: A tool's name: OpenAI's rule (letters, digits, ``_``, ``-``) with Anthropic's length and
#: the ``.``/``:`` of MCP-style names; a name goes into the prompt and the forced call's
#: grammar, so quotes, newlines and control characters never reach either.
MAX_TOOL_NAME = 128
TOOL_NAME = re.compile(rf"[A-Za-z0-9_.:-]{{1,{MAX_TOOL_NAME}}}")

Fail = Callable[[str], Exception]


@dataclass(frozen=True)
class ToolCall:
    """A call the assistant made: ``arguments`` is the JSON object of its arguments."""

    name: str
    arguments: Mapping[str, Any]
    id: str = ""

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "arguments": dict(self.arguments)}
        if self.id:
            out["id"] = self.id
        return out


@dataclass(frozen=True)
class ChatMessage:
    """One turn. ``tool_call_id``/``tool_name`` say which call a ``tool`` turn answers.
    ``images``: image files (:mod:`modeld.wire.images`), each shown to the model at its offset in
    ``content`` (``image_at``, characters; none given: all before the text, as Ollama does)."""

    role: str
    content: str = ""
    thinking: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    tool_name: str = ""
    images: tuple[bytes, ...] = ()
    image_at: tuple[int, ...] = ()

    def offsets(self) -> tuple[int, ...]:
        """Where each image goes in ``content``."""
        return self.image_at or (0,) * len(self.images)

    def with_markers(self, marker: str) -> str:
        """``content`` with ``marker`` where each image goes (the runner swaps it for the
        image's tokens)."""
        out, last = [], 0
        for at in self.offsets():
            out += [self.content[last:at], marker]
            last = at
        return "".join(out) + self.content[last:]

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.images:
            out["images"] = list(self.images)
        if self.image_at:
            out["image_at"] = list(self.image_at)
        if self.thinking:
            out["thinking"] = self.thinking
        if self.tool_calls:
            out["tool_calls"] = [c.to_wire() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_name:
            out["tool_name"] = self.tool_name
        return out


@dataclass(frozen=True)
class Tool:
    """A function the model may call; ``parameters`` is a JSON Schema of its arguments."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        if self.parameters is not None:
            out["parameters"] = dict(self.parameters)
        return out

    def schema(self) -> dict[str, Any]:
        """The JSON Schema a forced call's arguments follow (no parameters: any object)."""
        return dict(self.parameters) if self.parameters else {"type": "object"}

    def openai(self) -> dict[str, Any]:
        """The OpenAI shape chat templates iterate over (``tools[i].function.name``)."""
        fn: dict[str, Any] = {"name": self.name, "description": self.description,
                              "parameters": dict(self.parameters or {"type": "object",
                                                                     "properties": {}})}
        return {"type": "function", "function": fn}


# --------------------------------------------------------------------------- parsing


def parse_messages(value: Any, fail: Fail) -> tuple[ChatMessage, ...]:
    """The wire form of a message list; every error names the message and its field."""
    if not isinstance(value, list) or not value:
        raise fail("'messages' must be a non-empty list of messages")
    messages = tuple(_message(i, m, fail) for i, m in enumerate(value))
    check_count(sum(len(m.images) for m in messages), fail)
    return messages


def _message(i: int, m: Any, fail: Fail) -> ChatMessage:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise fail(f"{where} must be an object with 'role' and 'content'")
    role = m.get("role")
    if role not in ROLES:
        raise fail(f"{where}.role must be one of {', '.join(ROLES)} (got {role!r})")
    content = m.get("content", "" if role == "assistant" and m.get("tool_calls") else None)
    if not isinstance(content, str):
        raise fail(f"{where}.content must be a string")
    thinking = _opt_str(m, "thinking", where, fail)
    calls: list[ToolCall] = []
    raw_calls = m.get("tool_calls")
    if raw_calls is not None:
        if role != "assistant" or not isinstance(raw_calls, list):
            raise fail(f"{where}.tool_calls must be a list, on an assistant message")
        calls = [_call(f"{where}.tool_calls[{j}]", c, fail) for j, c in enumerate(raw_calls)]
    images = parse_list(m.get("images"), f"{where}.images", fail)
    return ChatMessage(role, content, thinking, tuple(calls),
                       _opt_str(m, "tool_call_id", where, fail),
                       _opt_str(m, "tool_name", where, fail), images,
                       _image_at(m.get("image_at"), len(images), len(content), where, fail))


def _image_at(value: Any, n: int, length: int, where: str, fail: Fail) -> tuple[int, ...]:
    """``image_at``: one offset into the content per image, in order (absent: all at 0)."""
    if value is None:
        return ()
    if (not isinstance(value, list) or len(value) != n
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or value != sorted(value) or (value and not 0 <= value[0] <= value[-1] <= length)):
        raise fail(f"{where}.image_at must be one offset into the content per image, in order")
    return tuple(value)


def _call(where: str, c: Any, fail: Fail) -> ToolCall:
    if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"]:
        raise fail(f"{where} must be an object with a 'name'")
    args = c.get("arguments", {})
    if isinstance(args, str):  # OpenAI sends the arguments as JSON text; templates want objects
        try:
            args = parse_json(args, f"{where}.arguments") if args.strip() else {}
        except InvalidRequestError as exc:  # nested too deep, or not UTF-8 text
            raise fail(exc.message) from None
        except ValueError:
            raise fail(f"{where}.arguments is not valid JSON") from None
    if not isinstance(args, dict):
        raise fail(f"{where}.arguments must be a JSON object")
    call_id = c.get("id", "")
    if not isinstance(call_id, str):
        raise fail(f"{where}.id must be a string")
    return ToolCall(c["name"], args, call_id)


def _opt_str(m: Mapping[str, Any], key: str, where: str, fail: Fail) -> str:
    value = m.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise fail(f"{where}.{key} must be a string")
    return value


def parse_tools(value: Any, fail: Fail) -> tuple[Tool, ...]:
    """``tools``: a list of ``{name, description?, parameters?}`` (the wire form)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise fail(f"'tools' must be a list of at most {MAX_TOOLS} tools")
    tools: list[Tool] = []
    for i, t in enumerate(value):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise fail(f"tools[{i}] must be an object with a 'name'")
        if not TOOL_NAME.fullmatch(t["name"]):
            raise fail(f"tools[{i}].name must be 1 to {MAX_TOOL_NAME} letters, digits, '_', "
                       f"'-', '.' or ':' (got {t['name'][:80]!r})")
        params = t.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise fail(f"tools[{i}].parameters must be a JSON Schema object")
        desc = t.get("description") or ""
        if not isinstance(desc, str):
            raise fail(f"tools[{i}].description must be a string")
        tools.append(Tool(t["name"], desc, params))
    if len({t.name for t in tools}) != len(tools):
        raise fail("'tools' has two tools of the same name")
    return tuple(tools)


def parse_tool_choice(value: Any, tools: Sequence[Tool], fail: Fail) -> str:
    """``auto`` (default), ``none``, ``required``, or the name of one tool (``{"name": …}``)
    that must be called. Returns the choice, a tool's name standing for itself."""
    if value is None:
        return "auto"
    if isinstance(value, dict):
        name = value.get("name")
        if not isinstance(name, str) or name not in {t.name for t in tools}:
            raise fail(f"'tool_choice' names no declared tool: {name!r}")
        return "function:" + name
    if value not in CHOICES:
        raise fail(f"'tool_choice' must be one of {', '.join(CHOICES)} or {{\"name\": …}}")
    if value == "required" and not tools:
        raise fail("'tool_choice' is 'required' but no 'tools' were given")
    return str(value)


def forces_call(tools: Sequence[Tool], choice: str) -> bool:
    """The reply must be a tool call: ``required`` or one named tool, with tools declared."""
    return bool(tools) and choice not in ("auto", "none")


def forced_tool(choice: str) -> str | None:
    """The one tool a choice names (None for auto/none/required)."""
    return choice.removeprefix("function:") if choice.startswith("function:") else None


def parse_format(value: Any, fail: Fail) -> str | dict[str, Any] | None:
    """``format``: ``"json"`` (any JSON object) or a JSON Schema the reply must satisfy."""
    if value is None or value == "":
        return None
    if value == "json":
        return "json"
    if isinstance(value, dict):
        return value
    raise fail("'format' must be \"json\" or a JSON Schema object")


def format_schema(fmt: str | dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema a ``format`` holds a reply to (``"json"``: any object)."""
    return fmt if isinstance(fmt, dict) else {"type": "object"}


# --------------------------------------------------------------------------- templates


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as Hugging Face chat templates expect them: ``content`` never None, assistant
    ``tool_calls`` as ``{id, type, function: {name, arguments: object}}``, tool results with
    ``tool_call_id`` and ``name``, and the thinking as ``reasoning_content``."""
    out: list[dict[str, Any]] = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.thinking:
            d["reasoning_content"] = m.thinking
        if m.tool_calls:
            d["tool_calls"] = [{"id": c.id or f"call_{i}", "type": "function",
                                "function": {"name": c.name, "arguments": dict(c.arguments)}}
                               for i, c in enumerate(m.tool_calls)]  # fmt: skip
        if m.role == "tool":
            if m.tool_call_id:
                d["tool_call_id"] = m.tool_call_id
            if m.tool_name:
                d["name"] = m.tool_name
        out.append(d)
    return out


def plain_text(m: ChatMessage) -> str:
    """A message as text for formats that know no tools (``qa``, ``gemma``, ``plain``): its
    calls and results written out, so the model still sees them."""
    parts = [m.content] if m.content else []
    for c in m.tool_calls:
        parts.append(json.dumps({"name": c.name, "arguments": dict(c.arguments)},
                                ensure_ascii=False))
    if m.role == "tool":
        label = f"Result of {m.tool_name or 'the tool call'}"
        return f"{label}: {m.content}"
    return "\n".join(parts)


def tools_prompt(tools: Sequence[Tool]) -> str:
    """A system text that shows the tools to a model whose template knows none (a schema
    the model never sees gives junk: ollama#8162)."""
    lines = ["You can call these tools. To call one, reply with only a JSON object "
             '{"name": <tool name>, "arguments": <arguments object>}.']  # fmt: skip
    for t in tools:
        lines.append(json.dumps(t.openai()["function"], ensure_ascii=False))
    return "\n".join(lines)

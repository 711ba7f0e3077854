"""Constrained decoding: the GBNF grammar a request's reply must follow, built and checked in
the daemon before any runner sees it.

Sources: a ``format`` ("json" or a JSON Schema: Ollama's ``format``, OpenAI's
``response_format``, ``modeld run --format``) and forced tool calls (``tool_choice``
``required`` or one named tool: the reply is ``{"name": …, "arguments": …}`` whose arguments
follow the tool's ``parameters``). Schemas become GBNF with llama-cpp-python's port of
llama.cpp's converter; the text is then parsed by llama.cpp's own grammar parser. A grammar that
parser rejects makes ``llama_sampler_init_grammar`` return NULL, and llama-cpp-python's sampler
chain would add that NULL and crash the runner (llama.cpp#19051, #22396): here it is a 400
naming what could not be used, and the model never runs unconstrained.

llama_cpp is imported on first use only (a daemon that never sees a format never loads it).
"""

from __future__ import annotations

import ctypes
import json
import threading
from collections.abc import Sequence
from typing import Any

from modeld.errors import InvalidRequestError
from modeld.messages import Tool, forced_tool

#: Largest grammar text accepted (a schema's repetition bounds expand into nested rules).
MAX_GRAMMAR_BYTES = 1 << 20
_HINT = "simplify the schema (llama.cpp's converter supports the JSON Schema subset of " \
        "docs/protocol.md), or send 'format': 'json'"  # fmt: skip
_lock = threading.Lock()
_log_lines: list[str] = []
_callback: Any = None


def for_request(fmt: str | dict[str, Any] | None, tools: Sequence[Tool],
                tool_choice: str) -> str | None:
    """The GBNF a reply must follow, or None when it is free text (raises InvalidRequestError
    naming the part that cannot be used)."""
    forced = bool(tools) and tool_choice not in ("auto", "none")
    if fmt is not None and tools and tool_choice != "none":
        raise InvalidRequestError(
            "'format' and 'tools' cannot be used together",
            hint="constrain the reply with a format, or let the model call tools, not both")
    if forced:
        schema = tool_call_schema(tools, forced_tool(tool_choice))
        return check(from_schema(schema, "the tool's 'parameters'"), "tool_choice")
    if fmt is None:
        return None
    if isinstance(fmt, dict):
        return check(from_schema(fmt, "format"), "format")
    from llama_cpp.llama_grammar import JSON_GBNF

    return check(JSON_GBNF, "format")


def tool_call_schema(tools: Sequence[Tool], only: str | None) -> dict[str, Any]:
    """The JSON Schema of one call: ``{"name": <a tool>, "arguments": <its parameters>}``."""
    chosen = [t for t in tools if only is None or t.name == only]
    shapes = [{"type": "object", "properties": {
        "name": {"const": t.name},
        "arguments": dict(t.parameters) if t.parameters else {"type": "object"},
    }, "required": ["name", "arguments"]} for t in chosen]  # fmt: skip
    return shapes[0] if len(shapes) == 1 else {"anyOf": shapes}


def from_schema(schema: dict[str, Any], what: str) -> str:
    """GBNF for ``schema`` (llama.cpp's converter: raises on what it does not support)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        return str(json_schema_to_gbnf(json.dumps(schema)))
    except RecursionError:
        raise InvalidRequestError(f"{what}: the JSON Schema nests too deeply",
                                  hint=_HINT) from None
    except Exception as exc:  # the converter asserts on what it cannot translate
        text = str(exc) or type(exc).__name__
        raise InvalidRequestError(f"{what}: this JSON Schema cannot be used: {text[:300]}",
                                  hint=_HINT) from None


def check(gbnf: str, what: str) -> str:
    """``gbnf`` if llama.cpp's parser accepts it (with no vocabulary: parsing needs none)."""
    import llama_cpp

    if len(gbnf.encode()) > MAX_GRAMMAR_BYTES:
        raise InvalidRequestError(f"{what}: the grammar built from it is over "
                                  f"{MAX_GRAMMAR_BYTES} bytes", hint=_HINT)
    with _lock:
        _capture_log(llama_cpp)
        _log_lines.clear()
        sampler = llama_cpp.llama_sampler_init_grammar(None, gbnf.encode(), b"root")
        if not sampler:
            why = next((ln for ln in _log_lines if "error" in ln), "it failed to parse")
            raise InvalidRequestError(f"{what}: llama.cpp rejected the grammar: {why[:300]}",
                                      hint=_HINT)
        llama_cpp.llama_sampler_free(sampler)
    return gbnf


def _capture_log(llama_cpp: Any) -> None:
    """Keep llama.cpp's messages (the parser says why it failed) instead of printing them."""
    global _callback
    if _callback is not None:
        return

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
    def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", errors="replace").strip()
        if line:
            del _log_lines[:-20]
            _log_lines.append(line)

    _callback = _log
    llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))

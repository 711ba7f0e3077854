"""Constrained decoding: the GBNF grammar a request's reply must follow, built and checked in
the daemon before any runner sees it.

Sources: a ``format`` ("json" or a JSON Schema: Ollama's ``format``, OpenAI's
``response_format``, ``modeld run --format``) and forced tool calls (``tool_choice``
``required`` or one named tool: the reply is ``{"name": …, "arguments": …}`` whose arguments
follow the tool's ``parameters``). Schemas become GBNF with :mod:`modeld.schema` (bounded
before it builds, every keyword enforced or refused); the text is then parsed by llama.cpp's
own grammar parser. A grammar that
parser rejects makes ``llama_sampler_init_grammar`` return NULL, and llama-cpp-python's sampler
chain would add that NULL and crash the runner (llama.cpp#19051, #22396): here it is a 400
naming what could not be used, and the model never runs unconstrained.

The parser is llama.cpp's own, from the libllama that llama_cpp ships, loaded on first use with
ctypes: ``import llama_cpp`` would bring numpy and its BLAS into the daemon for two functions
(26 MiB of its resident memory, against 4 MiB for the library alone; issue 35).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

from modeld.errors import InvalidRequestError
from modeld.replyparse import native_family
from modeld.wire.messages import Tool, forced_tool, forces_call, format_schema

#: Largest grammar text accepted by default (the ``max_grammar_bytes`` setting; a schema's
#: repetition bounds expand into nested rules, and enum/const lists are bounded from it
#: before their tree is built: :func:`modeld.schema.convert.constant_limits`).
MAX_GRAMMAR_BYTES = 1 << 20
#: Deepest nesting of groups handed to llama.cpp's parser (a schema's ``maxLength: 100000``
#: nests 100000 deep and crashed it with a stack overflow: llama.cpp#22396's family).
MAX_NESTING = 1024
_HINT = "simplify the schema (docs/protocol.md lists the JSON Schema subset modeld enforces), " \
        "or send 'format': 'json'"  # fmt: skip
_lock = threading.Lock()
log = logging.getLogger("modeld.daemon")


def for_request(fmt: str | dict[str, Any] | None, tools: Sequence[Tool],
                tool_choice: str, family: str = "generic",
                max_bytes: int = MAX_GRAMMAR_BYTES) -> str | None:
    """The GBNF a reply must follow, or None when it is free text (raises InvalidRequestError
    naming the part that cannot be used). ``family``: the tool-call syntax of the model's
    template (:func:`modeld.replyparse.native_family`): a forced call is written in it.
    ``max_bytes``: the largest grammar (the ``max_grammar_bytes`` setting)."""
    if fmt is not None and tools and tool_choice != "none":
        raise InvalidRequestError(
            "'format' and 'tools' cannot be used together",
            hint="constrain the reply with a format, or let the model call tools, not both")
    if forces_call(tools, tool_choice):
        schema = tool_call_schema(tools, forced_tool(tool_choice), family)
        call = from_schema(schema, "the tool's 'parameters'", max_bytes)
        return check(_wrapped(call, family), "tool_choice", max_bytes)
    if fmt is None:
        return None
    # "json": any object, as the converter writes it (its numbers have at most 16 digits,
    # where llama-cpp-python's JSON_GBNF lets a greedy base model write zeros forever)
    return check(from_schema(format_schema(fmt), "format", max_bytes), "format", max_bytes)


#: How each family writes one forced call around its JSON object (llama-server's forms).
_WRAP = {
    "hermes": ('"<tool_call>\\n"', '"\\n</tool_call>"'),
    "mistral": ('"[TOOL_CALLS]["', '"]"'),
    "llama3": ("", ""),
    "generic": ("", ""),
}


def _wrapped(call: str, family: str) -> str:
    """``call``'s grammar (its ``root`` the JSON object) inside the family's markers."""
    before, after = _WRAP.get(family, ("", ""))
    if not before and not after:
        return call
    body = call.replace("root ::=", "forced-tool-call ::=", 1)
    return f"root ::= {before} forced-tool-call {after}\n{body}"


def family_of(path: str) -> str:
    """The tool-call syntax of the model file at ``path`` (its GGUF chat template's)."""
    try:
        st = os.stat(path)
    except OSError:
        return "generic"
    return _family_of(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _family_of(path: str, size: int, mtime_ns: int) -> str:
    from modeld.model.gguf import read_chat_template

    try:
        template = read_chat_template(path)
    except Exception:  # an unreadable file fails its load with its own message
        return "generic"
    return str(native_family(template))


def check_bounds(fmt: str | dict[str, Any] | None, tools: Sequence[Tool],
                 max_bytes: int = MAX_GRAMMAR_BYTES) -> None:
    """Refuse at once what the build would refuse for its enum/const lists
    (:func:`modeld.schema.convert.check_constants`), before a child is started for it."""
    from modeld.schema.convert import check_constants

    if isinstance(fmt, dict):
        check_constants(fmt, "format", max_bytes)
    for tool in tools:
        check_constants(tool.schema(), "the tool's 'parameters'", max_bytes)


def tool_call_schema(tools: Sequence[Tool], only: str | None,
                     family: str = "generic") -> dict[str, Any]:
    """The JSON Schema of one call: ``{"name": <a tool>, "arguments": <its parameters>}``
    (Llama 3 names the arguments ``parameters``)."""
    key = "parameters" if family == "llama3" else "arguments"
    chosen = [t for t in tools if only is None or t.name == only]
    shapes = [{"type": "object", "properties": {
        "name": {"const": t.name},
        key: t.schema(),
    }, "required": ["name", key]} for t in chosen]  # fmt: skip
    return shapes[0] if len(shapes) == 1 else {"anyOf": shapes}


def from_schema(schema: dict[str, Any], what: str, max_bytes: int = MAX_GRAMMAR_BYTES) -> str:
    """GBNF for ``schema`` (:mod:`modeld.schema`: raises naming what it cannot hold)."""
    from modeld import schema as converter

    try:
        built = converter.to_gbnf(schema, what, max_bytes)
    except RecursionError:  # bounded by the converter; kept as a last guard
        raise InvalidRequestError(f"{what}: the JSON Schema nests too deeply",
                                  hint=_HINT) from None
    if built.unchecked:  # annotations by JSON Schema's default: accepted, not held
        log.info("%s: not checked (no grammar for them): %s", what, "; ".join(built.unchecked))
    return built.gbnf


def check(gbnf: str, what: str, max_bytes: int = MAX_GRAMMAR_BYTES) -> str:
    """``gbnf`` if llama.cpp's parser accepts it (with no vocabulary: parsing needs none)."""
    if len(gbnf.encode()) > max_bytes:
        raise InvalidRequestError(f"{what}: the grammar built from it is over "
                                  f"{max_bytes} bytes", hint=_HINT + ", or raise the "
                                  "max_grammar_bytes setting")
    depth = nesting(gbnf)
    if depth > MAX_NESTING:  # llama.cpp's parser recurses per group: deeper overflows its stack
        raise InvalidRequestError(
            f"{what}: the grammar built from it nests {depth} groups deep (at most "
            f"{MAX_NESTING}): a repetition bound such as maxLength or maxItems is too large",
            hint=_HINT)
    lib = _libllama()
    sampler = lib.llama_sampler_init_grammar(None, gbnf.encode(), b"root")
    if sampler:
        lib.llama_sampler_free(sampler)
        return gbnf
    # Rejected (rare: modeld.schema writes grammars the parser takes): parse again with fd 2
    # on a file for llama.cpp's reason. Only here: this runs on a thread of the daemon, and a
    # runner started meanwhile would inherit the file as its stderr.
    with _lock, tempfile.TemporaryFile() as err:
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            sampler = lib.llama_sampler_init_grammar(None, gbnf.encode(), b"root")
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        if sampler:  # not expected: the same text parsed twice
            lib.llama_sampler_free(sampler)
            return gbnf
        err.seek(0)
        lines = err.read(4096).decode("utf-8", errors="replace").splitlines()
        why = next((ln for ln in lines if "error" in ln), "it failed to parse")
        raise InvalidRequestError(f"{what}: llama.cpp rejected the grammar: {why[:300]}",
                                  hint=_HINT)
    return gbnf


@functools.cache
def _libllama() -> ctypes.CDLL:
    """llama_cpp's libllama with the two grammar functions declared, found as llama_cpp finds
    it (``LLAMA_CPP_LIB_PATH``, else the package's ``lib``) without importing the package;
    llama_cpp's own handle (its declarations) where the file is not there."""
    spec = importlib.util.find_spec("llama_cpp")
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    roots = [override] if override else \
        [os.path.join(r, "lib") for r in (spec.submodule_search_locations or [])] if spec else []
    names = {"darwin": ("libllama.dylib", "libllama.so"),
             "win32": ("llama.dll", "libllama.dll")}.get(sys.platform, ("libllama.so",))
    found = [p for r in roots for n in names if os.path.exists(p := os.path.join(r, n))]
    if not found:
        import llama_cpp.llama_cpp

        return llama_cpp.llama_cpp._lib  # type: ignore[no-any-return]
    lib = ctypes.CDLL(found[0])
    lib.llama_sampler_init_grammar.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.llama_sampler_init_grammar.restype = ctypes.c_void_p
    lib.llama_sampler_free.argtypes = [ctypes.c_void_p]
    lib.llama_sampler_free.restype = None
    return lib


def nesting(gbnf: str) -> int:
    """The deepest nesting of ``( … )`` groups in GBNF text (quoted literals and character
    classes left out)."""
    depth = deepest = 0
    i, n = 0, len(gbnf)
    while i < n:
        ch = gbnf[i]
        if ch in "\"[":
            close = '"' if ch == '"' else "]"
            i += 1
            while i < n and gbnf[i] != close:
                i += 2 if gbnf[i] == "\\" else 1
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
        elif ch == "#":  # a comment runs to the end of the line
            while i < n and gbnf[i] != "\n":
                i += 1
        i += 1
    return deepest

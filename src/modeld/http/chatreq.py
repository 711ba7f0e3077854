"""Chat requests of the OpenAI and Ollama APIs translated into modeld's generate request:
messages with tool calls and results, tools, tool choice, output format, thinking, logprobs —
and every field checked: one modeld does is done, one it does not is a 400 naming it.

Each API's fields are declared once here (``*_FIELDS``); the sampling options come from
:mod:`modeld.wire.options`. The result is the body of a protocol ``generate`` request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from modeld.errors import InvalidRequestError
from modeld.http.imageparts import Content, ollama_images, openai_url
from modeld.wire import options
from modeld.wire.textcheck import parse_json

#: Fields an OpenAI chat/completions body may carry besides the sampling options. Those in
#: ``_NO_EFFECT`` change nothing a local model does (routing, storage, accounting at OpenAI).
OPENAI_FIELDS = frozenset({
    "model", "messages", "prompt", "stream", "stream_options", "tools", "tool_choice",
    "parallel_tool_calls", "response_format", "logprobs", "top_logprobs", "n",
    "reasoning_effort", "keep_alive", "num_ctx", "num_gpu", "user", "metadata", "store",
    "service_tier", "echo", "best_of", "suffix",
})  # fmt: skip
#: Ollama's fields that OpenAI-API clients of Ollama send at the top level (ollama#9355):
#: the keep-alive, the context and the GPU layers, in modeld's option names
OLLAMA_EXTRAS = {"keep_alive": "keep_alive", "num_ctx": "n_ctx", "num_gpu": "gpu_layers"}
_NO_EFFECT = ("user", "metadata", "store", "service_tier")
#: Top-level fields of Ollama's /api/chat and /api/generate.
OLLAMA_FIELDS = frozenset({
    "model", "messages", "prompt", "system", "stream", "format", "options", "keep_alive",
    "think", "tools", "raw", "images", "suffix", "template", "context", "logprobs",
    "top_logprobs", "tool_choice",  # modeld's extension: OpenAI's values
})  # fmt: skip
_OLLAMA_TOP_SAMPLING = ("logprobs", "top_logprobs")


def refuse_unknown(doc: Mapping[str, Any], known: Iterable[str], api: str) -> None:
    """A 400 naming the first field that is neither known nor a sampling option."""
    allowed = set(known) | (set(options.api_fields("openai")) if api == "openai" else set())
    for key in doc:
        if key not in allowed:
            raise InvalidRequestError(f"the field {key!r} is not supported by modeld",
                                      hint="leave it out; docs/protocol.md lists what the "
                                           f"{api} API accepts here")  # fmt: skip


def _bad(text: str) -> InvalidRequestError:
    return InvalidRequestError(text, hint="see docs/protocol.md")


# --------------------------------------------------------------------------- OpenAI


def openai_generate(doc: Mapping[str, Any], chat: bool) -> dict[str, Any]:
    """A protocol generate body (``messages`` or ``prompt``, ``tools``, ``tool_choice``,
    ``format``, ``think``; ``options`` without the defaults an endpoint adds)."""
    refuse_unknown(doc, OPENAI_FIELDS, "openai")
    n = doc.get("n")
    if n not in (None, 1):
        raise _bad("'n' must be 1: modeld returns one choice per request")
    for key in ("echo", "suffix"):
        if doc.get(key):
            raise _bad(f"'{key}' is not supported by modeld")
    if doc.get("best_of") not in (None, 1):
        raise _bad("'best_of' must be 1")
    body: dict[str, Any] = {}
    opts = {ours: doc[api] for api, ours in {**options.api_fields("openai"), **OLLAMA_EXTRAS}
            .items() if doc.get(api) is not None}  # fmt: skip
    if chat:
        body["messages"] = openai_messages(doc.get("messages"))
        if doc.get("logprobs") is not None:
            opts["logprobs"] = doc["logprobs"]
        if doc.get("top_logprobs") is not None:
            opts["top_logprobs"] = doc["top_logprobs"]
    else:
        lp = doc.get("logprobs")  # /v1/completions: an integer, the alternatives per token
        if lp is not None:
            if isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= 5:
                raise _bad("'logprobs' must be an integer in [0, 5]")
            opts.update(logprobs=True, top_logprobs=lp)
    if "max_tokens" in opts and isinstance(opts["max_tokens"], int) and opts["max_tokens"] < 1:
        raise _bad("'max_tokens' must be at least 1 (leave it out for no limit)")
    if doc.get("tools") is not None:
        body["tools"] = [_openai_tool(i, t) for i, t in enumerate(_list(doc["tools"], "tools"))]
    _tool_choice(doc, body)
    fmt = _response_format(doc.get("response_format"))
    if fmt is not None:
        body["format"] = fmt
    effort = doc.get("reasoning_effort")
    if effort is not None:
        if effort not in ("none", "minimal", "low", "medium", "high"):
            raise _bad("'reasoning_effort' must be none, minimal, low, medium or high")
        body["think"] = effort != "none"
    if doc.get("parallel_tool_calls") not in (None, True, False):
        raise _bad("'parallel_tool_calls' must be true or false")
    body["options"] = opts
    return body


def _tool_choice(doc: Mapping[str, Any], body: dict[str, Any]) -> None:
    """OpenAI's ``tool_choice`` (also accepted on Ollama's chat, which has none of its own)."""
    choice = doc.get("tool_choice")
    if isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict):
            raise _bad("'tool_choice' must be none, auto, required or "
                       '{"type": "function", "function": {"name": …}}')
        choice = {"name": fn.get("name")}
    if choice is not None:
        body["tool_choice"] = choice


def openai_messages(raw: Any) -> list[dict[str, Any]]:
    """OpenAI messages in modeld's wire form: content parts joined, ``developer`` as system,
    tool calls with their JSON-text arguments, tool results named after their call."""
    msgs = _list(raw, "messages")
    if not msgs:
        raise _bad("'messages' must be a non-empty list")
    names: dict[str, str] = {}  # tool call id -> name: the calls tool messages may answer
    out: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"{where} must be an object")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise _bad(f"{where}.role must be system, developer, user, assistant or tool "
                       f"(got {role!r})")
        content = m.get("content")
        if content is None and role != "assistant":
            raise _bad(f"{where}.content is required for a {role} message")
        msg = _openai_content(content, where).message(role)
        if role != "tool":  # only the tool messages right after an assistant's calls answer them
            names = {}
        if m.get("tool_calls"):
            msg["tool_calls"] = _calls(m["tool_calls"], where)
            names = {c["id"]: str(c["name"]) for c in msg["tool_calls"] if "id" in c}
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise _bad(f"{where}.tool_call_id is required for a tool message")
            if call_id not in names:
                raise unanswered_call(f"{where}.tool_call_id", call_id, "the assistant "
                                      "message with 'tool_calls' just before it")
            msg["tool_call_id"] = call_id
            msg["tool_name"] = names[call_id]
        thinking = m.get("reasoning_content", m.get("reasoning"))
        if isinstance(thinking, str) and thinking:
            msg["thinking"] = thinking
        out.append(msg)
    return out


def unanswered_call(where: str, call_id: str, needs: str) -> InvalidRequestError:
    """A tool result that answers no call (what OpenAI's and Anthropic's APIs refuse)."""
    return InvalidRequestError(
        f"{where}: {call_id!r} answers no tool call: a tool result must answer a call of "
        f"{needs}",
        hint="send the tool call before its result (with the same id), or drop the result",
        details={"call_id": call_id})


def _calls(raw: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` (``[{id?, function: {name, arguments}}]`` in
    both APIs; arguments JSON text in OpenAI's, an object in Ollama's) in the wire form."""
    out: list[dict[str, Any]] = []
    for j, c in enumerate(_list(raw, f"{where}.tool_calls")):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            raise _bad(f"{where}.tool_calls[{j}] needs a 'function'")
        call = {"name": fn.get("name"), "arguments": fn.get("arguments") or {}}
        if isinstance(c.get("id"), str):
            call["id"] = c["id"]
        out.append(call)
    return out


def _openai_content(content: Any, where: str) -> Content:
    out = Content()
    if content is None or isinstance(content, str):
        out.text(content or "")
        return out
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content parts")
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            out.text(part["text"])
        elif kind == "image_url":
            out.url(openai_url(part), f"{where}.content[{j}].image_url")
        else:
            raise _bad(f"{where}.content[{j}]: content parts of type {kind!r} are not "
                       "supported (text and image_url)")
    return out


def _openai_tool(i: int, t: Any) -> dict[str, Any]:
    if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(
            t.get("function"), dict):
        raise _bad(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{…}}}}")
    fn = t["function"]
    return {k: fn[k] for k in ("name", "description", "parameters") if fn.get(k) is not None}


def _response_format(rf: Any) -> str | dict[str, Any] | None:
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise _bad("'response_format.json_schema.schema' must be a JSON Schema object")
        return schema
    raise _bad("'response_format.type' must be text, json_object or json_schema")


# --------------------------------------------------------------------------- Ollama


def ollama_generate(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an Ollama chat/generate body beyond its prompt or messages: ``tools``,
    ``format``, ``think`` and the top-level ``logprobs``/``top_logprobs`` options."""
    refuse_unknown(doc, OLLAMA_FIELDS, "ollama")
    if doc.get("suffix"):
        raise _bad("'suffix' (fill-in-the-middle) is not supported by modeld")
    if doc.get("template"):
        raise _bad("'template' is not supported: modeld uses the model's own chat template")
    if doc.get("context"):
        raise _bad("'context' is not supported: send the conversation as /api/chat messages")
    body: dict[str, Any] = {}
    if doc.get("tools") is not None:
        body["tools"] = [_openai_tool(i, t) for i, t in enumerate(_list(doc["tools"], "tools"))]
    _tool_choice(doc, body)
    if doc.get("format") not in (None, ""):
        body["format"] = doc["format"]
    think = doc.get("think")
    if think is not None:
        if think not in (True, False, "low", "medium", "high"):
            raise _bad("'think' must be true, false, low, medium or high")
        body["think"] = think is not False
    return body


def ollama_messages(raw: Any) -> list[dict[str, Any]]:
    """Ollama messages in modeld's wire form (tool call arguments are objects already)."""
    msgs = _list(raw, "messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(f"{where} must be an object")
        msg = {k: m[k] for k in ("role", "content", "thinking", "tool_name") if k in m}
        if m.get("images"):  # base64, shown before the message's text (as Ollama does)
            msg["images"] = ollama_images(m["images"], f"{where}.images")
        if "tool_name" not in msg and isinstance(m.get("name"), str):
            msg["tool_name"] = m["name"]
        if m.get("tool_calls"):
            msg["tool_calls"] = _calls(m["tool_calls"], where)
        out.append(msg)
    return out


def ollama_tool_calls(calls: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Calls as Ollama's ``message.tool_calls``: arguments as an object."""
    return [{"function": {"index": i, "name": c["name"],
                          "arguments": parse_json(c["arguments"], f"tool_calls[{i}].arguments")}}
            for i, c in enumerate(calls)]  # fmt: skip


def tool_list(value: Any, *, keep: Callable[[Mapping[str, Any]], bool],
              schema_key: str) -> list[dict[str, Any]]:
    """Tools declared flat (``{name, description, <schema_key>}``: Anthropic's
    ``input_schema``, the Responses API's ``parameters``) in the wire form; those ``keep``
    refuses (tools the vendor runs itself: web search, code execution) are left out."""
    out: list[dict[str, Any]] = []
    for i, t in enumerate([] if value is None else _list(value, "tools")):
        if not isinstance(t, dict):
            raise _bad(f"tools[{i}] must be an object")
        if not keep(t):
            continue
        if not isinstance(t.get("name"), str):
            raise _bad(f"tools[{i}].name must be a string")
        schema = t.get(schema_key)
        if schema is not None and not isinstance(schema, dict):
            raise _bad(f"tools[{i}].{schema_key} must be a JSON Schema object")
        tool: dict[str, Any] = {"name": t["name"]}
        if t.get("description"):
            tool["description"] = t["description"]
        if schema is not None:
            tool["parameters"] = schema
        out.append(tool)
    return out


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(f"'{name}' must be a list")
    return value

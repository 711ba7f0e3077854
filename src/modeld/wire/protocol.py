"""Client protocol v1: message schema, validation and frame encoding (no zmq here).

Three layers, as in jupyter_client: building messages (:func:`request`, :func:`chunk`,
:func:`done`, :func:`error_reply`), encoding them to frames (:func:`encode` / :func:`decode`),
and socket I/O (only in :mod:`modeld.daemon.service` and the clients: :mod:`modeld.client`,
:mod:`modeld.http.bridge`, the CLI's fast path :mod:`modeld.cli.fastwire`; the envelope and the
reply rules they share are :mod:`modeld.wire.replyflow`). Keeping this layer pure lets it be tested
by round-trip and lets the daemon reject any bad input with a typed error instead of
crashing. The wire format is documented in ``docs/protocol.md``.

A message is one ZeroMQ frame holding one UTF-8 JSON object with ``v`` (protocol version),
``id`` (request id, chosen by the client) and ``type``; other keys depend on the type.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from modeld.errors import InvalidRequestError, ModeldError, ProtocolMismatchError
from modeld.wire import frames, options, requestfields
from modeld.wire.messages import parse_format
from modeld.wire.options import DEFAULTS as DEFAULT_SAMPLING
from modeld.wire.options import Sampling
from modeld.wire.replyflow import PROTOCOL_VERSION, body_of, envelope
from modeld.wire.requestfields import Asked, Fail, declare, flag, ints, maybe, one_of, text
from modeld.wire.textcheck import check_text, too_deep

#: Request types a client may send.
REQUEST_TYPES = frozenset(
    {
        "generate",
        "embed",
        "rerank",
        "load",
        "unload",
        "ps",
        "stats",
        "show",
        "ping",
        "version",
        "shutdown",
        "cancel",
    }
)
MODES = ("generate", "embed", "rerank")
MAX_ID_LENGTH = 128
#: Most sequences one runner decodes together (``parallel``; llama.cpp allows 256; more than
#: this only splits a context into slivers on a CPU).
MAX_PARALLEL = 64
#: Options of a generate request that are not sampling: the model's lifetime and context.
_LIFETIME_OPTIONS = frozenset({"keep_alive", "n_ctx", "raw", "deterministic", "gpu_layers"})
#: ``gpu_layers``: the most layers a request may ask on the GPUs (-1: as many as fit)
MAX_GPU_LAYERS = 1 << 16
#: Most documents one rerank request scores (each is one query-document pair to evaluate).
MAX_DOCUMENTS = 4096


class ProtocolError(InvalidRequestError):
    """A malformed message; ``request_id`` is set when the id could still be read."""

    def __init__(
        self,
        message: str,
        *,
        hint: str = "",
        details: dict[str, object] | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint, details=details)
        self.request_id = request_id


class VersionMismatchError(ProtocolMismatchError):
    """The peer speaks another protocol version; ``request_id`` as for ProtocolError."""

    def __init__(self, message: str, *, hint: str = "", details: dict[str, object] | None = None,
                 request_id: str | None = None) -> None:
        super().__init__(message, hint=hint, details=details)
        self.request_id = request_id


@dataclass(frozen=True)
class Message:
    """One decoded protocol message: header fields plus the type-specific body."""

    type: str
    id: str
    body: dict[str, Any] = field(default_factory=dict)
    v: int = PROTOCOL_VERSION

    def to_dict(self) -> dict[str, Any]:
        return envelope(self.type, self.id, self.body)


# --------------------------------------------------------------------------- building


def request(type_: str, request_id: str, **body: Any) -> Message:
    """A request message; ``None`` values are left out so defaults apply on the daemon."""
    return Message(type_, request_id, {k: v for k, v in body.items() if v is not None})


#: Optional parts of a generate ``chunk`` besides its ``text``: ``thinking`` (text),
#: ``tool_calls`` (OpenAI-style deltas), ``calls_done`` (calls complete, whole) and
#: ``logprobs`` (per-token entries).
CHUNK_PARTS = ("thinking", "tool_calls", "calls_done", "logprobs")


def chunk(request_id: str, text: str, **parts: Any) -> Message:
    """Generated text, with any of :data:`CHUNK_PARTS` that are not empty."""
    body: dict[str, Any] = {"text": text}
    body.update({k: v for k, v in parts.items() if k in CHUNK_PARTS and v})
    return Message("chunk", request_id, body)


def done(request_id: str, **body: Any) -> Message:
    return Message("done", request_id, body)


def error_reply(request_id: str, err: ModeldError) -> Message:
    return Message("error", request_id, err.to_dict())


# --------------------------------------------------------------------------- encoding


def encode(msg: Message) -> list[bytes]:
    """The frames of ``msg``: its JSON frame, then one frame per binary value (images:
    :mod:`modeld.wire.frames`). Non-finite floats are rejected, not sent."""
    try:
        return frames.dumps(msg.to_dict())
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"message cannot be encoded: {exc}", request_id=msg.id) from exc


def decode(parts: list[bytes]) -> Message:
    """Parse the frames of one message, raising ProtocolError on anything malformed.

    Leading empty frames (a REQ-style delimiter) are tolerated; then one JSON object frame,
    then the binary frames it names (:mod:`modeld.wire.frames`). A different ``v`` raises
    VersionMismatchError.
    """
    body_frames = list(parts)
    while body_frames and body_frames[0] == b"":
        body_frames.pop(0)
    if not body_frames:
        raise ProtocolError("expected a JSON frame, got none",
                            hint="send each message as one JSON frame (and its binary frames)")
    try:
        data = frames.loads(body_frames[0], body_frames[1:], parse_constant=_reject_constant)
    except frames.FrameError as exc:
        raise ProtocolError(f"the message's binary frames do not match it: {exc}",
                            hint='name each binary frame once, as {"$frame": N}, in an '
                            '"images" list', request_id=_leading_id(body_frames[0])) from None
    except RecursionError:
        deep = too_deep()
        raise ProtocolError(deep.message, hint=deep.hint, details=deep.details,
                            request_id=_leading_id(body_frames[0])) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"frame is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ProtocolError(f"message must be a JSON object, got {type(data).__name__}")
    rid = data.get("id")
    request_id = rid if isinstance(rid, str) and 0 < len(rid) <= MAX_ID_LENGTH else None
    version = data.get("v")
    if version != PROTOCOL_VERSION:
        raise VersionMismatchError(
            f"protocol version {version!r} is not supported (this side speaks {PROTOCOL_VERSION})",
            hint="use a modeld client and daemon from the same release",
            request_id=request_id,
        )
    if request_id is None:
        raise ProtocolError(f"'id' must be a non-empty string of at most {MAX_ID_LENGTH} chars")
    type_ = data.get("type")
    if not isinstance(type_, str):
        raise ProtocolError("'type' must be a string", request_id=request_id)
    body = body_of(data)
    try:  # a lone surrogate or deep nesting: refused here, not in a runner or a later walk
        check_text(body)
    except InvalidRequestError as exc:
        raise ProtocolError(exc.message, hint=exc.hint, details=exc.details,
                            request_id=request_id) from None
    return Message(type_, request_id, body, version)


def _leading_id(frame: bytes) -> str | None:
    """The ``id`` of a frame json could not parse, when it comes before any nested value (where
    modeld's clients put it): its error then reaches the request that sent it."""
    nested = min((i for i in (frame.find(b"[", 1), frame.find(b"{", 1)) if i > 0),
                 default=len(frame))
    found = re.search(rb'"id"\s*:\s*"([A-Za-z0-9_.:-]{1,%d})"' % MAX_ID_LENGTH, frame[:nested])
    return found.group(1).decode() if found else None


def reply_object(parts: list[bytes]) -> object:
    """The JSON value of a reply's frame, for :class:`modeld.wire.replyflow.ReplyStream`; None when
    it is no JSON (a client skips what it cannot read unless it is a reply to its request)."""
    try:
        return json.loads(parts[-1].decode("utf-8"), parse_constant=_reject_constant)
    except (IndexError, UnicodeDecodeError, ValueError, RecursionError):
        return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


# --------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class GenerateOptions:
    """A generate request's options: its sampling (declared in :mod:`modeld.wire.options`) and its
    model's lifetime and context (defaults are the daemon's)."""

    sampling: Sampling = DEFAULT_SAMPLING
    keep_alive: str | int | float | None = None
    n_ctx: int | None = None
    raw: bool = False
    gpu_layers: int | None = None  # layers on the GPUs, -1 auto (None: as loaded / the config's)
    #: Greedy output must not depend on other requests (None: true at temperature 0). Such a
    #: request runs alone on its runner when batching could change its tokens.
    deterministic: bool | None = None


@dataclass(frozen=True, kw_only=True)
class GenerateRequest(Asked):
    """A completion of ``prompt`` or a reply to ``messages`` (the fields it shares with the
    runner's message: :class:`modeld.wire.requestfields.Asked`); ``format`` "json" or a JSON Schema
    the reply must satisfy (the daemon makes it a grammar)."""

    mode: ClassVar[str] = "generate"  # the model mode it needs
    model: str | None
    options: GenerateOptions
    format: str | dict[str, Any] | None = None


@dataclass(frozen=True)
class EmbedRequest:
    mode: ClassVar[str] = "embed"
    model: str | None
    inputs: tuple[str, ...]
    keep_alive: str | int | float | None = None
    n_ctx: int | None = None
    gpu_layers: int | None = None  # as for a generate request


@dataclass(frozen=True)
class RerankRequest:
    """Score each document against the query with a reranker (a cross-encoder)."""

    mode: ClassVar[str] = "rerank"
    model: str | None
    query: str
    documents: tuple[str, ...]
    top_n: int | None = None  # None: every document, in input order; N: the N best, best first
    keep_alive: str | int | float | None = None
    n_ctx: int | None = None


_mode = maybe(one_of(MODES))


def _keep_alive(value: Any, name: str, fail: Fail,
                got: Mapping[str, Any]) -> str | int | float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise fail(f"{name!r} must be a duration string like '5m' or seconds")
    if isinstance(value, float) and not math.isfinite(value):
        raise fail(f"{name!r} must be finite")
    return value


def rpc_endpoints(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    """The model's llama.cpp RPC workers, a list of "HOST:PORT" (or a comma-separated
    string); absent or null: none asked."""
    from modeld.rpc.endpoints import parse_endpoints

    if value is None:
        return None
    if not isinstance(value, str | list):
        raise fail(f"{name!r} must be a list of \"HOST:PORT\" strings")
    try:
        return parse_endpoints(value)
    except InvalidRequestError as exc:
        raise fail(exc.message) from exc


def _kv_type(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    from modeld.model.kvcache import KV_CACHE_TYPES

    if value is not None and value not in KV_CACHE_TYPES:
        raise fail(f"{name!r} must be one of {', '.join(KV_CACHE_TYPES)}")
    return value


@dataclass(frozen=True, kw_only=True)
class LoadRequest:
    """A ``load`` request: each field declared once (check, doc); null or absent: not said."""

    model: str | None = declare(None, text, "the model's name or file")
    mode: str | None = declare(None, _mode, "generate, embed or rerank (None: what the model "
                               "is made for, rerank for a reranker)")
    n_ctx: int | None = declare(None, maybe(ints(1, 1 << 24)), "the context asked for")
    keep_alive: str | int | float | None = declare(None, _keep_alive, "how long it stays idle")
    pinned: bool = declare(False, flag, "never evicted for room")
    parallel: int | None = declare(None, maybe(ints(1, MAX_PARALLEL)), "sequences decoded "
                                   "together (None: the daemon's setting)")
    kv_unified: bool | None = declare(None, maybe(flag), "one pool of n_ctx cells shared by "
                                      "the sequences (None: the config's)")
    rpc: tuple[str, ...] | None = declare(None, rpc_endpoints, "llama.cpp RPC workers (None: the "
                                          "config's, or none)")
    kv_cache_type: str | None = declare(None, _kv_type, "f16, q8_0, q4_0 (None: the config's)")
    gpu_layers: int | None = declare(None, maybe(ints(-1, MAX_GPU_LAYERS)), "layers on the "
                                     "GPUs, -1 auto (None: the config's)")
    mmproj: str | None = declare(None, text, "the image projector to load with (\"\": none; "
                                 "None: found)")


@dataclass(frozen=True)
class UnloadRequest:
    model: str | None
    mode: str | None
    all: bool


@dataclass(frozen=True)
class ShowRequest:
    model: str | None
    mode: str | None = None  # None: what the model is made for (rerank for a reranker)
    n_ctx: int | None = None


@dataclass(frozen=True)
class CancelRequest:
    target: str


ParsedRequest = (
    GenerateRequest
    | EmbedRequest
    | RerankRequest
    | LoadRequest
    | UnloadRequest
    | ShowRequest
    | CancelRequest
    | None
)


def parse_request(msg: Message) -> ParsedRequest:
    """Validate a request's body and return its typed form (None for bodiless types).

    Raises ProtocolError (an InvalidRequestError) naming the bad field, so the client learns
    exactly what to fix. Unknown keys are ignored for forward compatibility.
    """
    if msg.type not in REQUEST_TYPES:
        raise ProtocolError(
            f"unknown request type {msg.type!r}",
            hint=f"known types: {', '.join(sorted(REQUEST_TYPES))}",
            request_id=msg.id,
        )
    parse = _PARSERS.get(msg.type)
    return None if parse is None else parse(_Body(msg))


def _generate(b: _Body) -> GenerateRequest:
    asked = requestfields.parse(b.body, requestfields.CLIENT, b.fail)
    return GenerateRequest(model=b.opt_str("model"), options=b.generate_options(),
                           format=parse_format(b.body.get("format"), b.fail), **asked)


def _embed(b: _Body) -> EmbedRequest:
    raw_inputs = b.body.get("inputs")
    if isinstance(raw_inputs, str):
        inputs: tuple[str, ...] = (raw_inputs,)
    elif isinstance(raw_inputs, list) and raw_inputs and all(isinstance(x, str)
                                                             for x in raw_inputs):
        inputs = tuple(raw_inputs)
    else:
        raise b.fail("'inputs' must be a string or a non-empty list of strings")
    return EmbedRequest(b.opt_str("model"), inputs, b.keep_alive(), b.n_ctx(), b.gpu_layers())


def _rerank(b: _Body) -> RerankRequest:
    query = b.opt_str("query")
    if query is None:
        raise b.fail("'query' (a string) is required")
    docs = b.body.get("documents")
    if not (isinstance(docs, list) and docs and all(isinstance(x, str) for x in docs)):
        raise b.fail("'documents' must be a non-empty list of strings")
    if len(docs) > MAX_DOCUMENTS:
        raise b.fail(f"at most {MAX_DOCUMENTS} documents per request")
    top_n = b.int_field(b.body, "top_n", 1, MAX_DOCUMENTS, None)
    return RerankRequest(b.opt_str("model"), query, tuple(docs), top_n, b.keep_alive(), b.n_ctx())


def _load(b: _Body) -> LoadRequest:
    return LoadRequest(**requestfields.read(dataclasses.fields(LoadRequest), b.body, b.fail))


def _unload(b: _Body) -> UnloadRequest:
    everything = b.flag("all")
    model = b.opt_str("model")
    if not everything and model is None:
        raise b.fail("give 'model' or 'all': true")
    return UnloadRequest(model, b.mode(), everything)


def _show(b: _Body) -> ShowRequest:
    return ShowRequest(b.opt_str("model"), b.mode(), b.n_ctx())


def _cancel(b: _Body) -> CancelRequest:
    target = b.opt_str("target")
    if not target:
        raise b.fail("'target' (the id of the request to cancel) is required")
    return CancelRequest(target)


#: The request types with a body, and their parsers (the others carry none).
_PARSERS: dict[str, Callable[[_Body], ParsedRequest]] = {
    "generate": _generate, "embed": _embed, "rerank": _rerank, "load": _load,
    "unload": _unload, "show": _show, "cancel": _cancel,
}


class _Body:
    """Typed field access on a message body that raises ProtocolError naming the field."""

    def __init__(self, msg: Message) -> None:
        self.msg = msg
        self.body = msg.body

    def fail(self, text: str) -> ProtocolError:
        return ProtocolError(
            f"invalid {self.msg.type} request: {text}",
            hint="see docs/protocol.md",
            request_id=self.msg.id,
        )

    def opt_str(self, key: str, src: dict[str, Any] | None = None) -> str | None:
        value = (self.body if src is None else src).get(key)
        if value is not None and not isinstance(value, str):
            raise self.fail(f"{key!r} must be a string")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.body.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"{key!r} must be true or false")
        return value

    def mode(self) -> str | None:
        return cast("str | None", _mode(self.opt_str("mode"), "mode", self.fail, {}))

    def int_field(
        self, src: dict[str, Any], key: str, lo: int, hi: int, default: int | None
    ) -> int | None:
        value = src.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self.fail(f"{key!r} must be an integer in [{lo}, {hi}]")
        return value

    def n_ctx(self, src: dict[str, Any] | None = None) -> int | None:
        return self.int_field(self.body if src is None else src, "n_ctx", 1, 1 << 24, None)

    def gpu_layers(self, src: dict[str, Any] | None = None) -> int | None:
        return self.int_field(self.body if src is None else src, "gpu_layers", -1,
                              MAX_GPU_LAYERS, None)  # fmt: skip

    def keep_alive(self, src: dict[str, Any] | None = None) -> str | int | float | None:
        value = (self.body if src is None else src).get("keep_alive")
        return _keep_alive(value, "keep_alive", self.fail, {})

    def generate_options(self) -> GenerateOptions:
        raw_opts = self.body.get("options", {})
        if not isinstance(raw_opts, dict):
            raise self.fail("'options' must be an object")
        # keep_alive / n_ctx / raw may sit at top level (Ollama style) or inside options.
        src: dict[str, Any] = {
            k: self.body[k] for k in ("keep_alive", "n_ctx", "raw") if k in self.body
        }
        src.update(raw_opts)
        raw = src.get("raw", False)
        if not isinstance(raw, bool):
            raise self.fail("'raw' must be true or false")
        deterministic = src.get("deterministic")
        if deterministic is not None and not isinstance(deterministic, bool):
            raise self.fail("'deterministic' must be true or false")
        unknown = set(raw_opts) - options.NAMES - _LIFETIME_OPTIONS
        if unknown:
            raise self.fail(f"unknown option {sorted(unknown)[0]!r} (known: "
                            f"{', '.join(sorted(options.NAMES | _LIFETIME_OPTIONS))})")
        return GenerateOptions(
            sampling=options.parse(src, self.fail),
            keep_alive=self.keep_alive(src),
            n_ctx=self.n_ctx(src),
            raw=raw,
            gpu_layers=self.gpu_layers(src),
            deterministic=deterministic,
        )

"""Client protocol v1's requests: each request type's body validated into its typed form.

Separate from :mod:`.protocol` (messages, their building and their frames) because it is the
part that knows each request's fields and limits: the daemon parses with
:func:`parse_request`, the clients and the runner wire build from its types and limits
(:mod:`.loadfields` derives the runner's load message from :class:`LoadRequest`'s rules). A
bad field raises :class:`~modeld.wire.protocol.ProtocolError` naming it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from modeld.errors import InvalidRequestError
from modeld.wire import options, requestfields
from modeld.wire.messages import parse_format
from modeld.wire.options import DEFAULTS as DEFAULT_SAMPLING
from modeld.wire.options import Sampling
from modeld.wire.protocol import Message, ProtocolError
from modeld.wire.requestfields import Asked, Fail, declare, flag, ints, maybe, one_of, text

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
#: Most sequences one runner decodes together (``parallel``; llama.cpp allows 256; more than
#: this only splits a context into slivers on a CPU).
MAX_PARALLEL = 64
#: Options of a generate request that are not sampling: the model's lifetime and context.
_LIFETIME_OPTIONS = frozenset({"keep_alive", "n_ctx", "raw", "deterministic", "gpu_layers"})
#: ``gpu_layers``: the most layers a request may ask on the GPUs (-1: as many as fit)
MAX_GPU_LAYERS = 1 << 16
#: Most documents one rerank request scores (each is one query-document pair to evaluate).
MAX_DOCUMENTS = 4096


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

"""The one declaration of a generate request's model-facing fields (its sampling options are
:mod:`modeld.wire.options`').

Each field is a dataclass field whose metadata says how it is checked, its doc line and, by its
class, which hops carry it:

- :class:`Asked`: what the client asks and the runner honours (client -> daemon -> runner);
  the client protocol's request (:class:`modeld.wire.reqparse.GenerateRequest`) and the
  runner's spec (:class:`modeld.runner.specs.GenerateSpec`) both subclass it.
- :class:`Decided`: what the daemon adds for the runner (daemon -> runner only): its grammar,
  the determinism it promised, the threads it shares out, a resumed reply's tokens.

Everything else derives from these classes: both sides' parsers (:func:`parse`), the runner
message's fields (:func:`to_wire`, used by :func:`modeld.wire.runnerwire.generate`) and the daemon's
copy of a request into it (:func:`asked`). Adding a field: a line here, and its use in the
runner (and an HTTP or CLI mapping if a client should reach it).

Pure: no native imports, unit-tested on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modeld.wire.images import parse_list
from modeld.wire.messages import ChatMessage, Tool, parse_messages, parse_tool_choice, parse_tools

Fail = Callable[[str], Exception]
#: A field's check: (the value sent, the field's name, ``fail``, the fields checked before it)
#: -> its typed value (a field not sent is its default, unchecked).
Check = Callable[[Any, str, Fail, Mapping[str, Any]], Any]
#: The hops: the client's request to the daemon, the daemon's message to a runner.
CLIENT, RUNNER = "client", "runner"


def flag(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    if not isinstance(value, bool):
        raise fail(f"{name!r} must be true or false")
    return value


def text(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    if value is not None and not isinstance(value, str):
        raise fail(f"{name!r} must be a string")
    return value


def nonempty(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    if value is not None and (not isinstance(value, str) or not value):
        raise fail(f"{name!r} must be a non-empty string")
    return value


def _messages(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    return None if value is None else parse_messages(value, fail)


def _tools(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    return parse_tools(value, fail)


def _client_choice(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    """The client's ``tool_choice``: a word or ``{"name": …}`` (sent on as ``function:NAME``)."""
    return parse_tool_choice(value, got["tools"], fail)


def _wire_choice(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    if not isinstance(value, str):
        raise fail(f"{name!r} must be a string")
    return value


def _images(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    return parse_list(value, repr(name), fail)


def _tokens(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise fail(f"{name!r} must be a list of token ids")
    return tuple(value)


def ints(lo: int, hi: int) -> Check:
    """The check of an integer in [lo, hi]."""
    def check(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise fail(f"{name!r} must be an integer in [{lo}, {hi}]")
        return value
    return check


def maybe(check: Check) -> Check:
    """``check``, with null standing for "not said" (None)."""
    return lambda value, name, fail, got: None if value is None else check(value, name, fail, got)


def one_of(choices: Sequence[str]) -> Check:
    """The check of one of ``choices``."""
    def check(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
        if value not in choices:
            raise fail(f"{name!r} must be one of {', '.join(choices)}, got {value!r}")
        return str(value)
    return check


#: true, false or null (None: not said)
maybe_flag: Check = maybe(flag)


def _threads(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    return ints(0, 1024)(value, name, fail, got) or None  # 0: the load's


def _listed(value: Sequence[Any]) -> list[Any]:
    return [v.to_wire() if isinstance(v, ChatMessage | Tool) else dict(v)
            if isinstance(v, Mapping) else v for v in value]  # fmt: skip


def declare(default: Any, check: Check, doc: str, *, client: Check | None = None,
            always: bool = False, only_with: str | None = None) -> Any:
    """A field: ``check`` reads the runner's (wire) form, ``client`` the client's where it
    differs; the runner message carries it when it is not ``default`` (``always``: even then;
    ``only_with``: only beside that field). ``default`` MISSING: the field is required."""
    meta = {"check": check, "client": client or check, "doc": doc, "always": always,
            "only_with": only_with}  # fmt: skip
    return field(default=default, metadata=meta)


Fields = tuple[dataclasses.Field[Any], ...]


def read(fields: Fields, src: Mapping[str, Any], fail: Fail, *,
         client: bool = False) -> dict[str, Any]:
    """``fields`` read from ``src`` and checked (by their ``client`` checks if ``client``); a
    field not sent is its default, a required one is checked anyway (it fails)."""
    got: dict[str, Any] = {}
    for f in fields:
        if f.name in src or f.default is dataclasses.MISSING:
            got[f.name] = f.metadata["client" if client else "check"](
                src.get(f.name), f.name, fail, got)
        else:
            got[f.name] = f.default
    return got


def write(fields: Fields, values: Mapping[str, Any], what: str) -> dict[str, Any]:
    """The wire form of ``values`` of ``fields`` (defaults left out unless ``always``)."""
    unknown = set(values) - {f.name for f in fields}
    if unknown:
        raise TypeError(f"unknown {what} field {sorted(unknown)[0]!r}")
    out: dict[str, Any] = {}
    for f in fields:
        if f.default is dataclasses.MISSING and f.name not in values:
            raise TypeError(f"{what}: {f.name!r} is required")
        value = values.get(f.name, f.default)
        value = tuple(value) if isinstance(value, list) else value
        with_ = f.metadata["only_with"]
        if (value == f.default and not f.metadata["always"]) or (with_ and not values.get(with_)):
            continue
        out[f.name] = _listed(value) if isinstance(value, tuple) else value
    return out


@dataclass(frozen=True, kw_only=True)
class Asked:
    """What a generate request asks of the model (client -> daemon -> runner)."""

    prompt: str | None = declare(None, text, "text to complete (one of prompt, messages)")
    messages: tuple[ChatMessage, ...] | None = declare(None, _messages,
                                                       "the conversation to reply to")
    tools: tuple[Tool, ...] = declare((), _tools, "tools the model may call")
    tool_choice: str = declare("auto", _wire_choice, "auto, none, required or function:NAME",
                               client=_client_choice, only_with="tools")
    think: bool | None = declare(None, maybe_flag, "the model's thinking on/off (None: its own)")
    count_only: bool = declare(False, flag, "tokenize the prompt, evaluate nothing: the done "
                               "carries its prompt_tokens")
    stream: bool = declare(True, flag, "the client reads the reply as it comes (false: whole "
                           "at the end, so fewer, larger chunks)")
    images: tuple[bytes, ...] = declare((), _images, "images shown before the prompt "
                                      "(messages carry their own)")

    @property
    def has_images(self) -> bool:
        return bool(self.images) or any(m.images for m in self.messages or ())


@dataclass(frozen=True, kw_only=True)
class Decided:
    """What the daemon adds to a runner's generate message (daemon -> runner)."""

    raw: bool = declare(False, flag, "the prompt as is, no chat template (the client's "
                        "options.raw)", always=True)
    deterministic: bool = declare(False, flag, "greedy, sent only to an otherwise idle runner",
                                  always=True)
    grammar: str | None = declare(None, nonempty, "GBNF the reply follows (the daemon checked it)")
    n_threads: int | None = declare(None, _threads, "this request's CPU threads (None: the load's)")
    grow: bool = declare(False, flag, "a reply that runs out of cells stops for a larger context")
    resume: tuple[int, ...] = declare((), _tokens, "the tokens a grown reply wrote before")


ASKED: Fields = dataclasses.fields(Asked)
DECIDED: Fields = dataclasses.fields(Decided)
#: The fields each hop carries, in order.
HOPS: dict[str, Fields] = {CLIENT: ASKED, RUNNER: ASKED + DECIDED}
NAMES: frozenset[str] = frozenset(f.name for f in HOPS[RUNNER])
ASKED_NAMES: frozenset[str] = frozenset(f.name for f in ASKED)


def parse(src: Mapping[str, Any], hop: str, fail: Fail) -> dict[str, Any]:
    """The generate fields ``hop`` carries, read from ``src`` and checked; ``fail(text)`` makes
    the error to raise (the text names the field)."""
    if (src.get("prompt") is None) == (src.get("messages") is None):
        raise fail("give exactly one of 'prompt' or 'messages'")
    if src.get("messages") is not None and src.get("images"):
        raise fail("'images' goes with a 'prompt'; put a message's images on the message")
    return read(HOPS[hop], src, fail, client=hop == CLIENT)


def asked(req: Asked) -> dict[str, Any]:
    """What the daemon copies from a client's request into its runner's message."""
    return {f.name: getattr(req, f.name) for f in ASKED}


def to_wire(values: Mapping[str, Any]) -> dict[str, Any]:
    """The runner message's fields for ``values`` (others: their defaults, left out)."""
    return write(HOPS[RUNNER], values, "generate")

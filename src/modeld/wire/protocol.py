"""Client protocol v1: messages, their building and frame encoding (no zmq here).

Three layers, as in jupyter_client: building messages (:func:`request`, :func:`chunk`,
:func:`done`, :func:`error_reply`), encoding them to frames (:func:`encode` / :func:`decode`),
and socket I/O (only in :mod:`modeld.daemon.service` and the clients: :mod:`modeld.client`,
:mod:`modeld.http.bridge`, the CLI's fast path :mod:`modeld.cli.fastwire`; the envelope and the
reply rules they share are :mod:`modeld.wire.replyflow`). Keeping this layer pure lets it be tested
by round-trip and lets the daemon reject any bad input with a typed error instead of
crashing. Each request body's fields and their validation are :mod:`modeld.wire.reqparse`.
The wire format is documented in ``docs/protocol.md``.

A message is one ZeroMQ frame holding one UTF-8 JSON object with ``v`` (protocol version),
``id`` (request id, chosen by the client) and ``type``; other keys depend on the type.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from modeld.errors import InvalidRequestError, ModeldError, ProtocolMismatchError
from modeld.wire import frames
from modeld.wire.replyflow import PROTOCOL_VERSION, body_of, envelope
from modeld.wire.textcheck import check_text, too_deep

MAX_ID_LENGTH = 128


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

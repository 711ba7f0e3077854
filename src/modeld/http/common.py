"""What the Ollama and OpenAI routes share: request bodies, model names, options, statuses."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from starlette.requests import ClientDisconnect, Request

from modeld.config import Settings
from modeld.errors import (
    CancelledError,
    ErrorCode,
    InvalidRequestError,
    ModeldError,
    ModelNotFoundError,
    clip,
)
from modeld.http.bridge import Bridge
from modeld.http.checks import check_common
from modeld.wire import options
from modeld.wire.textcheck import check_text, too_deep

#: HTTP status for each modeld error code: every API and route answers with these (a body
#: over the limit, :class:`BodyTooLarge`, is a 413; Anthropic's API has no 499: a 400 there).
STATUS: dict[str, int] = {
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.INVALID_MODEL: 400,
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.CONTEXT_EXCEEDED: 400,
    ErrorCode.INSUFFICIENT_MEMORY: 503,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.TIMEOUT: 503,  # no room within queue_timeout, or the queue is full
    ErrorCode.DAEMON_UNAVAILABLE: 503,
    ErrorCode.RUNNER_CRASHED: 500,
    ErrorCode.RPC_WORKER: 502,  # an RPC worker (an upstream server) failed or is busy
    ErrorCode.CANCELLED: 499,
    ErrorCode.PROTOCOL_MISMATCH: 500,
    ErrorCode.INTERNAL: 500,
    # a pull's own (http/pull.py): the hub refused, failed or sent a file that did not verify
    ErrorCode.UNAUTHORIZED: 403,
    ErrorCode.NETWORK: 502,
    ErrorCode.DISK_FULL: 507,
    ErrorCode.VERIFICATION_FAILED: 502,
}


def validation_of(done: dict[str, Any]) -> dict[str, Any]:
    """``{"validation": …}`` of a reply held to a JSON Schema (its check against the whole
    schema: docs/protocol.md), else nothing: each API adds it to its own reply object."""
    return {"validation": done["validation"]} if "validation" in done else {}


def status_of(exc: ModeldError) -> int:
    if isinstance(exc, BodyTooLarge):
        return 413
    return STATUS.get(exc.code, 500)


def headers_of(exc: ModeldError) -> dict[str, str]:
    """``Retry-After`` (seconds) on a busy answer whose error says when to try again."""
    retry = exc.details.get("retry_after_s")
    if isinstance(retry, int | float) and retry > 0:
        return {"Retry-After": str(max(1, round(retry)))}
    return {}


def message_of(exc: ModeldError) -> str:
    """modeld's message with its hint: what went wrong and what to do next."""
    return f"{exc.message} ({exc.hint})" if exc.hint else exc.message


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request body as a JSON object, at most ``limit`` bytes (else a 400-class error)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    data = bytearray()
    try:
        async for part in request.stream():
            data += part
            if len(data) > limit:
                raise BodyTooLarge(limit)
    except ClientDisconnect:  # it left, or its body was too slow (limits.py): nobody to tell
        raise CancelledError("the client left before its request's body arrived") from None
    if not data.strip():
        raise InvalidRequestError("the request has no body",
                                  hint='send a JSON object, e.g. {"model": "default", ...}')
    try:
        doc = json.loads(data)
    except RecursionError:
        raise too_deep() from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"the body is not JSON: {exc}",
                                  hint="send a JSON object") from None
    if not isinstance(doc, dict):
        raise InvalidRequestError("the body must be a JSON object", hint="send a JSON object")
    check_text(doc)  # a lone surrogate or deep nesting: this request's 400, never a 500 later
    check_common(doc)
    return doc


class BodyTooLarge(InvalidRequestError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than {limit} bytes",
                         hint="send less, or raise max_message_bytes")


class API:
    """What both APIs' route classes hold: the bridge to the daemon, the settings, and the
    body limit (``max_message_bytes``)."""

    def __init__(self, bridge: Bridge, settings: Settings) -> None:
        self.bridge, self.settings = bridge, settings
        self.limit = int(settings.max_message_bytes)

    def model(self, name: object) -> str | None:
        """The reference a request's ``model`` sends (:func:`model_ref`)."""
        return model_ref(name, self.settings)


def input_list(doc: dict[str, Any], hint: str) -> list[Any]:
    """The ``input`` of an embedding request as a non-empty list (one string becomes a list)."""
    inputs = doc.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise InvalidRequestError("'input' must be a string or a list of strings", hint=hint)
    return inputs


def model_ref(name: object, settings: Settings) -> str | None:
    """An API model name as a modeld reference: ``name:tag`` (Ollama's tags) loses the tag,
    ``default`` or nothing is the built-in model. A file path is refused unless
    ``http_model_paths`` allows it (an HTTP caller may be anyone allowed in, and must not make
    the daemon open, or tell about, a file outside the models)."""
    if name is None or name == "":
        return None
    if not isinstance(name, str):
        raise InvalidRequestError("'model' must be a string", hint="name a model: GET /api/tags")
    ref = name.strip()
    if "/" not in ref and ":" in ref:
        ref = ref.rsplit(":", 1)[0]
    if ref in ("", "default"):
        return None
    return ref if settings.http_model_paths else model_name(ref, settings)


def model_name(ref: str, settings: Settings) -> str:
    """``ref`` if it names a model rather than a file (:func:`modeld.registry.named_ref`), else
    the same "unknown model" whether or not such a file exists."""
    from modeld.registry import named_ref

    named = named_ref(ref, Path(settings.models_dir).expanduser())
    if named is None:
        raise ModelNotFoundError(
            f"unknown model {clip(ref)!r}: the HTTP API takes model names, not file paths",
            hint="GET /api/tags (or /v1/models) lists the models; the daemon's owner can name a"
            " file with an alias (the config's aliases table) or set http_model_paths = true",
            details={"name": clip(ref)})  # fmt: skip
    return named


def iso_now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def iso_time(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


#: max_tokens for "no limit": generation ends at end-of-text or at the end of the context.
UNLIMITED = options.MAX_TOKENS

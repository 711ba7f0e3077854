"""Checks every API body gets before a route reads it (issue 21, item 5).

A body whose ``model`` is not a name (``"model": 123``) reached the daemon's name handling and
came back as a plain-text 500; a ``stream`` that is not a boolean (``"no"``) was taken as
true. Each is this request's 400, in the route's own error shape (the route catches it), with
the field named. Fields the lead's per-route table declares (options, messages) are checked
there, not here.
"""

from __future__ import annotations

from typing import Any

from modeld.errors import InvalidRequestError


def check_common(doc: dict[str, Any]) -> None:
    """Raise :class:`InvalidRequestError` for a top-level field of the wrong type."""
    model = doc.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequestError(
            f"'model' must be a string, not {_kind(model)}",
            hint="name a model: GET /api/tags or /v1/models lists them, 'default' is built in",
            details={"field": "model"},
        )
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequestError(
            f"'stream' must be true or false, not {_kind(stream)}",
            hint='send "stream": false for one JSON document, true for a stream',
            details={"field": "stream"},
        )


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"

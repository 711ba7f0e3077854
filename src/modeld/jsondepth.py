"""The one depth bound of JSON: every JSON text modeld parses (request bodies, tool-call
arguments in requests and in a model's replies, replies held to a schema) nests at most
:data:`MAX_DEPTH` levels.

Deeper JSON made ``json.loads`` raise RecursionError (at ~1,000 levels: a tool call's
arguments hung the request with "internal error in _on_client"), and anything shallower but
deep recursed through every later walk of it. No API body needs more than a few dozen levels
(OpenAI allows 10 levels of schema nesting). Pure: stdlib only, so every layer may use it
(:mod:`modeld.wire.textcheck` turns :class:`TooDeep` into a 400 naming the field).
"""

from __future__ import annotations

import json
from typing import Any

#: The deepest nesting of objects and arrays accepted (the value itself is level 1).
MAX_DEPTH = 64


class TooDeep(ValueError):
    """JSON nested deeper than :data:`MAX_DEPTH`; ``where``: the path reached (``[0][0]…``,
    empty when the parser itself gave up)."""

    def __init__(self, where: str = "") -> None:
        super().__init__(f"it nests deeper than {MAX_DEPTH} levels")
        self.where = where


def loads(text: str | bytes, where: str = "", **options: Any) -> Any:
    """``json.loads(text, **options)``, raising :class:`TooDeep` (a ValueError) past the
    bound, with ``where`` and the path below it."""
    try:
        value = json.loads(text, **options)
    except RecursionError:
        raise TooDeep(where) from None
    check(value, where)
    return value


def check(value: Any, where: str = "") -> None:
    """Raise :class:`TooDeep` when ``value`` (decoded JSON) nests past the bound."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, at, depth = stack.pop()
        if depth >= MAX_DEPTH:
            raise TooDeep(at)
        if isinstance(item, dict):
            stack.extend((v, f"{at}.{k}", depth + 1) for k, v in item.items()
                         if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]", depth + 1) for i, v in enumerate(item)
                         if isinstance(v, dict | list))

"""JSON that cannot cross a boundary is refused where it enters: text with no UTF-8 form, and
nesting deeper than :data:`MAX_DEPTH` (declared in :mod:`modeld.jsondepth`).

JSON may carry ``"\\ud83d"`` (a lone UTF-16 surrogate): valid JSON, but no UTF-8 encoding exists
for it, so the first ``str.encode("utf-8")`` on its way to the tokenizer raises. Found deep in a
runner, that error once ended another client's stream and left the bad request in flight for
good. Every entry point (HTTP bodies, the daemon's protocol decode, the CLI's prompt) checks
decoded JSON here and answers ``invalid_request`` naming the field. Pure: no imports beyond
errors and jsondepth.

Nesting: a body 100,000 arrays deep made ``json.loads`` raise RecursionError (a 500), and a
tool's parameters 600 levels deep recursed through every later walk of them. No API body
needs more than a few dozen levels (OpenAI allows 10 levels of schema nesting), so deeper JSON
is refused once, here, with its path: the walks after this one never meet it. JSON carried
as text inside JSON (a tool call's ``arguments``, in a request or a model's reply) is parsed
with the same bound by :func:`parse_json`: 1,000 levels there made ``json.loads`` raise
RecursionError deep in the daemon, and the request was never answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from modeld.jsondepth import MAX_DEPTH, TooDeep, loads  # the one bound of every JSON

if TYPE_CHECKING:
    from modeld.errors import InvalidRequestError

_LEAVES = frozenset((str, int, float, bool, type(None)))  # JSON's scalars


def bad_text(value: object, path: str = "") -> tuple[str, str] | None:
    """The first (field path, offending string) whose text is not encodable as UTF-8, or None.

    Paths read like ``messages[1].content``; a bad object key is reported at its own path.
    Raises :func:`too_deep` for a container nested deeper than :data:`MAX_DEPTH`.
    """
    stack: list[tuple[object, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth >= MAX_DEPTH and isinstance(item, dict | list):
            raise too_deep(where)
        if isinstance(item, str):
            if not _encodable(item):
                return where or "the body", item
        elif isinstance(item, dict):
            clean = _all_encodable([*item, *item.values()])
            for key, sub in reversed(list(item.items())):
                if clean and not isinstance(sub, dict | list):
                    continue
                name = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and not _encodable(key):
                    return name, key
                stack.append((sub, name, depth + 1))
        elif isinstance(item, list):
            if not _all_encodable(item):
                inner: Sequence[int] = range(len(item))
            elif _LEAVES.issuperset(map(type, item)):  # no walk of 50,000 leaves in Python
                continue
            else:
                inner = [i for i, sub in enumerate(item) if isinstance(sub, dict | list)]
            for i in reversed(inner):
                stack.append((item[i], f"{where}[{i}]", depth + 1))
    return None


def _all_encodable(items: list[object]) -> bool:
    """Whether every string among ``items`` has a UTF-8 form: one encode of them all (a
    50,000-word enum was 50,000 paths built and checked one by one: 50 ms of the daemon's
    loop). Joined lone surrogates stay unencodable: a str never pairs them."""
    return _encodable("".join([x for x in items if isinstance(x, str) and not x.isascii()]))


def too_deep(where: str = "") -> InvalidRequestError:
    """The error for JSON nested deeper than :data:`MAX_DEPTH` (``where``: the path reached,
    empty when the parser itself gave up)."""
    from modeld.errors import InvalidRequestError  # on the error path only: the fast CLI path

    shown = where.encode("utf-8", "backslashreplace").decode("utf-8")
    where = shown[:200] + ("…" if len(shown) > 200 else "")
    at = f" at {where}" if where else ""
    return InvalidRequestError(
        f"the JSON nests deeper than {MAX_DEPTH} levels{at}",
        hint=f"flatten it: objects and arrays may nest at most {MAX_DEPTH} levels deep",
        details={"max_depth": MAX_DEPTH, **({"field": where} if where else {})},
    )


def parse_json(text: str | bytes, where: str = "", **options: Any) -> Any:
    """``text`` parsed as JSON under the body's bounds: nesting past :data:`MAX_DEPTH` (and
    ``json.loads``'s own RecursionError, ~1,000 levels) is :func:`too_deep` naming ``where``;
    text with no UTF-8 form is :func:`check_text`'s error. Other bad JSON raises ValueError,
    as ``json.loads`` does. ``options``: ``json.loads``'s (``parse_float``, ...)."""
    try:
        value = loads(text, where, **options)
    except TooDeep as exc:
        raise too_deep(exc.where) from None
    check_text(value, where)
    return value


def _encodable(text: str) -> bool:
    if text.isascii():  # known without a pass over it (a base64 image: 270 KB copied twice)
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(value: object, what: str = "") -> None:
    """Raise :class:`InvalidRequestError` naming the first field of ``value`` that holds text
    with no UTF-8 form (a lone surrogate such as ``\\ud83d``)."""
    found = bad_text(value, what)
    if found is None:
        return
    field, text = found
    field = field.encode("utf-8", "backslashreplace").decode("utf-8")  # a bad key, shown safely
    from modeld.errors import InvalidRequestError  # on the error path only: the fast CLI path

    raise InvalidRequestError(
        f"{field!r} is not valid Unicode text: it holds {_first_bad(text)} (a lone UTF-16 "
        "surrogate, which has no UTF-8 form)",
        hint="send valid UTF-8: escape a character outside the BMP as a surrogate pair "
        "(\\ud83d\\ude00) or send it unescaped",
        details={"field": field},
    )


def _first_bad(text: str) -> str:
    for ch in text:
        if 0xD800 <= ord(ch) <= 0xDFFF:
            return f"\\u{ord(ch):04x}"
    return "an unencodable character"


def from_argv(text: str, what: str) -> str:
    """A command-line argument as text: Python maps bytes that are not UTF-8 to lone
    surrogates (``surrogateescape``); those are reported like a file in another encoding."""
    if _encodable(text):
        return text
    return decode_utf8(text.encode("utf-8", "surrogateescape"), what)


def decode_utf8(data: bytes, what: str) -> str:
    """``data`` as UTF-8 text, or :class:`InvalidRequestError` saying where the first bad byte
    is (a prompt file or stdin in another encoding)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        from modeld.errors import InvalidRequestError  # on the error path only

        raise InvalidRequestError(
            f"{what} is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            hint="convert it first, e.g. iconv -f latin1 -t utf-8",
            details={"field": what, "offset": exc.start},
        ) from None

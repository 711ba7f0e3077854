"""Numeric bounds as grammars: ``minimum``/``maximum`` (and the exclusive ones) on integers,
and on numbers when the bounds are whole numbers.

A range of non-negative integers becomes, per digit count, the classic digit-range
decomposition (``[17, 342]``: ``"1" [7-9] | [2-9] [0-9] | [1-2] [0-9]{2} | "3" ([0-3] [0-9] |
"4" [0-2])``), so its size grows with the number of digits, never with the width of the range.
The JSON integer rule writes at most 16 digits, so an open end is the 16-digit limit.
Reading the bounds out of a schema and narrowing them to what the grammar writes are here too
(not in :mod:`.convert`'s walk): they are the same arithmetic, and the walk only asks for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

LIMIT = 10**16 - 1  # the largest integral part the grammar writes (16 digits)
_FRACTION = '("." [0-9]{1,16})?'
_ZERO_FRACTION = '("." [0]{1,16})?'
_NONZERO_FRACTION = '"." [0]{0,15} [1-9] [0-9]{0,15}'


def _digits(n: int) -> str:
    return "[0-9]" if n == 1 else f"[0-9]{{{n}}}"


def _class(lo: str, hi: str) -> str:
    return f"[{lo}]" if lo == hi else f"[{lo}-{hi}]"


def _same_length(a: str, b: str) -> str:
    """Digit strings of ``a``'s length from ``a`` to ``b`` (``a`` <= ``b``)."""
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    head = f'"{a[:i]}"' if i else ""
    if i == len(a):
        return head
    lo, hi, rest_a, rest_b = a[i], b[i], a[i + 1:], b[i + 1:]
    n = len(rest_a)
    zeros, nines = "0" * n, "9" * n
    if rest_a == zeros and rest_b == nines:
        tail = f"{_class(lo, hi)} {_digits(n)}" if n else _class(lo, hi)
        return f"{head} {tail}".strip()
    alts = []
    first, last = lo, hi
    if rest_a != zeros:
        alts.append(f'"{lo}" ({_same_length(rest_a, nines)})')
        first = chr(ord(lo) + 1)
    if rest_b != nines:
        last = chr(ord(hi) - 1)
    if first <= last:
        alts.append(f"{_class(first, last)} {_digits(n)}")
    if rest_b != nines:
        alts.append(f'"{hi}" ({_same_length(zeros, rest_b)})')
    return f"{head} ({' | '.join(alts)})".strip()


def non_negative(lo: int, hi: int) -> str:
    """Integers ``lo``..``hi`` (0 <= lo <= hi) as digits without leading zeros."""
    parts: list[str] = []
    full: list[int] = []  # widths whose every number is in range: one part for all of them
    for width in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (width - 1) if width > 1 else 0)
        b = min(hi, 10**width - 1)
        if width > 1 and a == 10 ** (width - 1) and b == 10**width - 1:
            full.append(width - 1)
        elif a <= b:
            parts.append(_same_length(str(a), str(b)))
    if full:
        more = f"{{{full[0]}}}" if len(full) == 1 else f"{{{full[0]},{full[-1]}}}"
        parts.append(f"[1-9] [0-9]{more}")
    return " | ".join(parts)


def read_bounds(
    schema: Mapping[str, Any], fail: Callable[[str], Exception]
) -> dict[str, float]:
    """A schema's numeric bounds (draft 4's boolean exclusive flags turned into values);
    ``fail(key)`` is raised for a bound that is no finite number."""
    out: dict[str, float] = {}
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        value = schema.get(key)
        if value is None:
            continue
        if isinstance(value, bool) and key.startswith("exclusive"):
            base = key.replace("exclusiveM", "m")
            if value and base in schema:
                out[key] = out.pop(base, schema[base])
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not math.isfinite(value):  # fmt: skip
            raise fail(key)
        out.setdefault(key, value)
    return out


def integer_bounds(bounds: dict[str, float]) -> tuple[int, int]:
    """The inclusive integer range of ``bounds`` (minimum, exclusiveMinimum, maximum,
    exclusiveMaximum: finite numbers); an open end is the limit."""
    lo, hi = -LIMIT, LIMIT
    if "minimum" in bounds:
        lo = max(lo, math.ceil(bounds["minimum"]))
    if "exclusiveMinimum" in bounds:
        lo = max(lo, math.floor(bounds["exclusiveMinimum"]) + 1)
    if "maximum" in bounds:
        hi = min(hi, math.floor(bounds["maximum"]))
    if "exclusiveMaximum" in bounds:
        hi = min(hi, math.ceil(bounds["exclusiveMaximum"]) - 1)
    return max(lo, -LIMIT), min(hi, LIMIT)


def number_bounds(bounds: dict[str, float]) -> tuple[int, bool, int, bool] | None:
    """The whole-number range a number's ``bounds`` give the grammar: (lo, lo excluded, hi, hi
    excluded), an open end being the limit; None when a bound past the limit leaves no number
    the grammar writes. A fractional bound gives the whole numbers around it (the complete
    reply is validated against the bound itself)."""
    lo, lo_open, hi, hi_open = -LIMIT, False, LIMIT, False
    for key, value in bounds.items():
        low = key in ("minimum", "exclusiveMinimum")
        if abs(value) > LIMIT:  # past what the grammar writes (16 digits)
            if (value > 0) == low:
                return None
            continue  # a bound past the limit on the open side: the limit holds it
        whole = float(value).is_integer()
        v = int(value) if whole else math.floor(value) if low else math.ceil(value)
        is_open = whole and key.startswith("exclusive")
        if low and (v > lo or (v == lo and is_open)):
            lo, lo_open = v, is_open
        if not low and (v < hi or (v == hi and is_open)):
            hi, hi_open = v, is_open
    return lo, lo_open, hi, hi_open


def integer_range(lo: int, hi: int) -> str:
    """Integers ``lo``..``hi`` (inclusive, lo <= hi, within the limit)."""
    alts = []
    if lo < 0:
        alts.append(f'"-" ({non_negative(max(1, -hi), -lo)})')
    if hi >= 0:
        alts.append(non_negative(max(0, lo), hi))
    return " | ".join(alts)


def _magnitudes(a: int, a_open: bool, b: int, b_open: bool) -> list[str]:
    """Unsigned decimals m (integral part, optional fraction) with a <= m <= b, either end
    excluded when open; a, b whole numbers, 0 <= a <= b."""
    alts = []
    if a == b:
        if not a_open and not b_open:
            alts.append(f'"{a}" {_ZERO_FRACTION}')
        return alts
    alts.append(f'"{a}" ' + (_NONZERO_FRACTION if a_open else _FRACTION))
    if a + 1 <= b - 1:
        alts.append(f"({non_negative(a + 1, b - 1)}) {_FRACTION}")
    if not b_open:
        alts.append(f'"{b}" {_ZERO_FRACTION}')
    return alts


def number_range(lo: int, lo_open: bool, hi: int, hi_open: bool) -> str:
    """Decimals (no exponent) from ``lo`` to ``hi``, whole-number bounds, either excluded."""
    alts = []
    if hi > 0 or (hi == 0 and not hi_open):  # zero and up
        start, start_open = (lo, lo_open) if lo >= 0 else (0, False)
        alts += _magnitudes(start, start_open, hi, hi_open) if start <= hi else []
    if lo < 0:  # below zero: "-" and a magnitude in (max(0, -hi), -lo]
        low, low_open = (-hi, hi_open) if hi < 0 else (0, True)
        neg = _magnitudes(low, low_open, -lo, lo_open)
        if neg:
            alts.append(f'"-" ({" | ".join(neg)})')
    return " | ".join(alts)

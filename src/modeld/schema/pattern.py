"""A string schema's ``pattern`` as a grammar of the JSON text of the matching strings.

A JSON Schema pattern is a search: a side without its anchor (``^``, ``$``) may hold any text
around the match (``^[A-Z]`` is any string that starts with a capital). Alternatives at the
top level share the anchors (``^a|b$`` is written as ``^(a|b)$``, a subset of what it matches:
every reply still matches). Supported: literals, ``.``, classes (``[a-z]``,
``[^…]``, ``\\d \\w \\s`` and their negations), groups, ``|``, ``* + ?`` and ``{m}``, ``{m,}``,
``{m,n}``. Characters JSON must escape (``"``, ``\\``, controls) are written escaped, so the
reply stays valid JSON. Quantifiers are bounded before anything is built: each count, and the
product of the counts nested around any atom, at most :data:`MAX_REPEAT`; groups nest at most
:data:`MAX_GROUPS` deep.
"""

from __future__ import annotations

from collections.abc import Callable

from modeld.errors import InvalidRequestError
from modeld.schema.gbnf import literal, repeat
from modeld.schema.keywords import MAX_REPEAT

MAX_GROUPS = 32
_TOP = 0x10FFFF
_SPECIAL = [(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)]  # JSON escapes these
_ESCAPE_CLASSES = {
    "d": [(0x30, 0x39)],
    "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "s": [(0x09, 0x0D), (0x20, 0x20)],
}
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
Ranges = list[tuple[int, int]]
Fail = Callable[[str], InvalidRequestError]


def _normalize(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: Ranges) -> Ranges:
    out, start = [], 0
    for lo, hi in _normalize(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= _TOP:
        out.append((start, _TOP))
    return out


def _chars(ranges: Ranges) -> str:
    """The JSON text of one character from ``ranges``: a class of those JSON writes as they
    are, and the escaped form of each that JSON escapes."""
    ranges = _normalize(ranges)
    plain = _normalize(_intersect(ranges, _complement(_SPECIAL)))
    alts = []
    if plain:
        alts.append("[" + "".join(_cls(lo, hi) for lo, hi in plain) + "]")
    for lo, hi in _intersect(ranges, _SPECIAL):
        for code in range(lo, hi + 1):
            json_form = {0x22: '\\"', 0x5C: "\\\\", 0x0A: "\\n", 0x09: "\\t", 0x0D: "\\r",
                         0x08: "\\b", 0x0C: "\\f"}.get(code, f"\\u{code:04x}")  # fmt: skip
            alts.append(literal(json_form))
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def _cls(lo: int, hi: int) -> str:
    def one(c: int) -> str:
        return f"\\U{c:08X}" if c > 0xFFFF else f"\\u{c:04X}" if c > 0x7E or c < 0x21 or \
            chr(c) in "]\\-^" else chr(c)  # fmt: skip

    return one(lo) if lo == hi else f"{one(lo)}-{one(hi)}"


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    return [(max(x, y), min(xh, yh)) for x, xh in a for y, yh in b if max(x, y) <= min(xh, yh)]


class _Parser:
    def __init__(self, text: str, fail: Fail) -> None:
        self.text, self.i, self.fail = text, 0, fail

    def peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def alternation(self, depth: int) -> tuple[str, int]:
        """The alternatives up to a ``)`` or the end, and the largest product of quantifier
        counts nested in them."""
        alts, most = [], 1
        while True:
            text, count = self.sequence(depth)
            alts.append(text or '""')
            most = max(most, count)
            if self.peek() != "|":
                return " | ".join(alts), most
            self.i += 1

    def sequence(self, depth: int) -> tuple[str, int]:
        items: list[str] = []
        most = 1
        while self.peek() not in ("", "|", ")"):
            start = self.i
            atom, inner = self.atom(depth)
            low, high = self.quantifier()
            count = inner * max(low, high if high is not None else low, 1)
            if count > MAX_REPEAT:
                raise self.fail(f"repeats over {MAX_REPEAT} times at offset {start + 1} "
                                "(nested quantifiers multiply)")
            most = max(most, count)
            if (low, high) == (1, 1):
                items.append(atom)
            else:
                items.append(repeat(atom if _one_symbol(atom) else f"({atom})", low, high))
        return " ".join(i for i in items if i), most

    def atom(self, depth: int) -> tuple[str, int]:
        """One atom and the product of the quantifier counts nested in it."""
        ch = self.peek()
        self.i += 1
        if ch == "(":
            if depth >= MAX_GROUPS:
                raise self.fail(f"nests groups over {MAX_GROUPS} deep")
            if self.peek() == "?":
                raise self.fail(f"uses '(?' at offset {self.i - 1} (lookarounds, named or "
                                "non-capturing groups are not supported)")
            inner, count = self.alternation(depth + 1)
            if self.peek() != ")":
                raise self.fail("leaves a '(' open")
            self.i += 1
            return f"({inner})", count
        if ch == "[":
            return _chars(self.char_class()), 1
        if ch == ".":
            return _chars(_complement([(0x0A, 0x0A), (0x0D, 0x0D)])), 1
        if ch == "\\":
            return _chars(self.escape()), 1
        if ch in "*+?{":
            raise self.fail(f"has '{ch}' at offset {self.i - 1} with nothing to repeat")
        if ch in "^$":
            raise self.fail(f"has '{ch}' inside it (anchors only at the start and end)")
        return _chars([(ord(ch), ord(ch))]), 1

    def escape(self) -> Ranges:
        ch = self.peek()
        if not ch:
            raise self.fail("ends with a lone backslash")
        self.i += 1
        if ch.lower() in _ESCAPE_CLASSES:
            ranges = _ESCAPE_CLASSES[ch.lower()]
            return _complement(ranges) if ch.isupper() else ranges
        if ch in _CONTROL_ESCAPES:
            return [(ord(_CONTROL_ESCAPES[ch]),) * 2]
        if ch == "u" and len(self.text) >= self.i + 4:
            code = self.text[self.i:self.i + 4]
            self.i += 4
            try:
                return [(int(code, 16),) * 2]
            except ValueError:
                raise self.fail(f"has '\\u{code}', not a character escape") from None
        if ch.isalnum():
            raise self.fail(f"uses the escape '\\{ch}', which is not supported")
        return [(ord(ch), ord(ch))]

    def char_class(self) -> Ranges:
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges: Ranges = []
        first = True
        while first or self.peek() != "]":
            first = False
            ch = self.peek()
            if not ch:
                raise self.fail("leaves a '[' open")
            self.i += 1
            part = self.escape() if ch == "\\" else [(ord(ch), ord(ch))]
            if len(part) == 1 and part[0][0] == part[0][1] and self.peek() == "-" \
                    and self.text[self.i + 1:self.i + 2] not in ("]", ""):  # fmt: skip
                self.i += 1
                end = self.peek()
                self.i += 1
                hi = self.escape()[0][0] if end == "\\" else ord(end)
                if hi < part[0][0]:
                    raise self.fail(f"has a reversed class range ending at offset {self.i}")
                part = [(part[0][0], hi)]
            ranges += part
        self.i += 1
        return _complement(ranges) if negate else ranges

    def quantifier(self) -> tuple[int, int | None]:
        ch = self.peek()
        if ch in ("*", "+", "?"):
            self.i += 1
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        if ch != "{":
            return 1, 1
        end = self.text.find("}", self.i)
        body = self.text[self.i + 1:end] if end > 0 else ""
        low_text, _, high_text = body.partition(",")
        if end < 0 or not low_text.strip().isdigit() or not (
                high_text.strip().isdigit() or not high_text.strip()):  # fmt: skip
            raise self.fail(f"has a quantifier at offset {self.i} that is not {{m}}, {{m,}} "
                            "or {m,n}")
        self.i = end + 1
        low = int(low_text[:12])
        high = low if "," not in body else (int(high_text[:12]) if high_text.strip() else None)
        if high is not None and high < low:
            raise self.fail(f"has {{{body}}}, whose maximum is below its minimum")
        return low, high


def _one_symbol(text: str) -> bool:
    """Whether ``text`` is one GBNF symbol (a literal, a class, a group), so a quantifier
    applies to all of it."""
    if text.startswith('"') and text.endswith('"') and '" ' not in text:
        return True
    if text.startswith("[") and text.endswith("]") and "] " not in text:
        return True
    if text.startswith("(") and text.endswith(")"):
        depth = 0
        for k, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and k < len(text) - 1:
                return False
        return True
    return False


#: Any text, as a JSON string's content writes it (beside a pattern's unanchored side).
_ANY = r'([^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))*'


def to_gbnf(pattern: str, fail: Fail) -> str:
    """The JSON string (quotes included) of strings ``pattern`` finds a match in (all of
    them, save top-level alternatives under one anchor: see the module's docstring)."""
    start = pattern.startswith("^")
    backslashes = len(pattern[:-1]) - len(pattern[:-1].rstrip("\\"))
    end = pattern.endswith("$") and backslashes % 2 == 0 and len(pattern) > int(start)
    parser = _Parser(pattern[int(start):len(pattern) - int(end)], fail)
    body, _ = parser.alternation(0)
    if parser.i != len(parser.text):
        raise fail(f"has an unbalanced ')' at offset {parser.i + 1}")
    parts = ["" if start else _ANY, f"({body or chr(34) * 2})", "" if end else _ANY]
    return '"\\"" ' + " ".join(p for p in parts if p) + ' "\\"" space'

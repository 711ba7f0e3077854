"""Names as a terminal may print them: a file name is whatever bytes its creator chose, and a
raw escape sequence, newline or right-to-left override (U+202E) in one would rewrite what the
user sees (``modeld list`` once printed them as they were). Every character Python does not
call printable (controls, format characters such as the bidirectional ones, separators other
than the space) is shown as its escape instead. Stdlib only: the fast path's ``ps`` uses it.
"""

from __future__ import annotations


def visible(text: str) -> str:
    """``text`` with each unprintable character written as ``\\xNN``, ``\\uNNNN`` or
    ``\\UNNNNNNNN``."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(ord(c)) for c in text)


def _escape(n: int) -> str:
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"

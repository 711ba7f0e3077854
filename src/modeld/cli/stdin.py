"""The prompt or inputs a command reads from stdin.

Apart from :mod:`modeld.cli.runcmd` because the fast path (:mod:`modeld.cli.entry`) reads
stdin too and must not pay for runcmd's imports (dataclasses, typing, the renderer: ~21 ms of a
47 ms warm ``modeld run``).
"""

from __future__ import annotations

import sys


def read_stdin_prompt() -> str | None:
    """The piped stdin text, or None when stdin is a terminal or empty."""
    if sys.stdin is None or sys.stdin.closed or sys.stdin.isatty():
        return None
    data = stdin_text()
    return data if data.strip() else None


def stdin_text() -> str:
    """All of stdin as text; bytes that are not UTF-8 (a latin-1 file) are a clear
    invalid-request error naming the offset, not a traceback or mojibake sent to a model."""
    from modeld.wire.textcheck import decode_utf8

    raw = getattr(sys.stdin, "buffer", None)
    return decode_utf8(raw.read(), "stdin") if raw is not None else sys.stdin.read()

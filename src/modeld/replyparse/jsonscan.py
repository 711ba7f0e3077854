"""Where a JSON value ends, found one character at a time (string- and escape-aware).

Why: a streamed tool call's arguments must flow out as they arrive, so the parser needs to know,
character by character, whether the arguments value is still open. The scanner only tracks
nesting; ``json.loads`` validates the value once it is complete.
"""

from __future__ import annotations

import enum
import json

WHITESPACE = " \t\r\n"
_SCALAR_START = "-0123456789tfn"
_CLOSERS = {"{": "}", "[": "]"}


class Scan(enum.Enum):
    MORE = "more"  # the character belongs to the value, which goes on
    DONE = "done"  # the character belongs to the value and completes it
    ENDED = "ended"  # the value (a bare scalar) ended before this character, not consumed
    ERROR = "error"  # the character cannot be part of a JSON value here


class ValueScanner:
    """Follows one JSON value (the caller skips whitespace before its first character)."""

    def __init__(self) -> None:
        self._stack: list[str] = []  # expected closing brackets
        self._in_string = False
        self._escape = False
        self._scalar = False
        self._started = False

    def push(self, ch: str) -> Scan:
        if not self._started:
            self._started = True
            if ch in _CLOSERS:
                self._stack.append(_CLOSERS[ch])
                return Scan.MORE
            if ch == '"':
                self._in_string = True
                return Scan.MORE
            if ch in _SCALAR_START:
                self._scalar = True
                return Scan.MORE
            return Scan.ERROR
        if self._in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
                if not self._stack:
                    return Scan.DONE
            return Scan.MORE
        if self._scalar:
            if ch in WHITESPACE or ch in ",]}":
                return Scan.ENDED
            return Scan.MORE
        if ch == '"':
            self._in_string = True
        elif ch in _CLOSERS:
            self._stack.append(_CLOSERS[ch])
        elif ch in "]}":
            if not self._stack or ch != self._stack.pop():
                return Scan.ERROR
            if not self._stack:
                return Scan.DONE
        return Scan.MORE


class StringReader:
    """Reads the body of a JSON string after its opening quote; decodes it at the closing one."""

    def __init__(self) -> None:
        self._raw: list[str] = []
        self._escape = False

    def push(self, ch: str) -> bool:
        """Take one character; True when it was the closing quote."""
        if self._escape:
            self._escape = False
        elif ch == "\\":
            self._escape = True
        elif ch == '"':
            return True
        self._raw.append(ch)
        return False

    def value(self) -> str | None:
        """The decoded string, or None when its escapes or characters are not valid JSON."""
        try:
            decoded = json.loads('"' + "".join(self._raw) + '"')
        except ValueError:
            return None
        return decoded if isinstance(decoded, str) else None


def parse_object(text: str) -> bool:
    """Whether ``text`` is a JSON object (duplicate keys allowed, as json.loads allows them)."""
    from modeld.jsondepth import loads

    try:
        return isinstance(loads(text), dict)
    except ValueError:  # not JSON, or nested past the bound of every JSON (jsondepth): no call
        return False

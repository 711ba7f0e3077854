"""The machinery shared by the tool-call syntaxes: text that flows while watching for a marker,
the raw text kept to give back when a call turns out malformed, and calls in a JSON array.

Why: each family (see ``families``) differs only in how a call starts and what surrounds its JSON;
how text streams, how a failed call falls back to text and how a list of call objects is read
are the same for all, and are easiest to get right once.
"""

from __future__ import annotations

from modeld.replyparse.callobj import CallObject, Step
from modeld.replyparse.events import CallLog, Event, TextDelta
from modeld.replyparse.jsonscan import WHITESPACE

TEXT = "text"


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker`` (and is shorter than it)."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class Stage:
    """Turns reply content into text and tool-call events; subclasses define the call syntax.

    In text mode, text goes out as soon as it cannot be the start of ``marker`` (None: calls
    cannot start mid-text). Whitespace next to a call is markup and is dropped (held until the
    next non-space decides). Other modes read one character at a time through ``char``, which
    returns False to hand the character back (after ``fail``, or on leaving for text mode).
    """

    marker: str | None = None

    def __init__(self, log: CallLog) -> None:
        self.log = log
        self.out: list[Event] = []
        self.mode = TEXT
        self.raw: list[str] = []  # text since the call began, given back as text on failure
        self._pending = ""  # held text: trailing whitespace and a possible partial marker
        self._after_call = False  # drop whitespace that follows a call
        self._dropped = ""  # whitespace dropped after a call, restored if the next call fails
        self._obj = CallObject(log)
        self._committed = False  # a call completed; only markup may follow until text mode

    def feed(self, text: str) -> list[Event]:
        while text:
            if self.mode == TEXT:
                text = self._text(text)
                continue
            i = 0
            while i < len(text) and self.mode != TEXT:
                if self.char(text[i]):
                    i += 1
            text = text[i:]
        return self._take()

    def finish(self) -> list[Event]:
        if self.mode == TEXT:
            pending, self._pending = self._pending, ""
            if not (self.log.calls and not pending.strip(WHITESPACE)):
                self.emit(pending)
        else:
            rest = "".join(self.raw)
            if not (self._committed and not rest.strip(WHITESPACE)):
                self.emit(rest)
            self.raw = []
            self.mode = TEXT
        return self._take()

    # -- used by subclasses ---------------------------------------------------------------

    def char(self, ch: str) -> bool:
        """Handle one character outside text mode; False when not consumed."""
        raise NotImplementedError

    def start(self, mode: str) -> None:
        """Enter a call syntax (``raw`` already holds the text that began it)."""
        self.mode = mode
        self._committed = False

    def emit(self, text: str) -> None:
        if text:
            self.out.append(TextDelta(text))

    def fail(self) -> bool:
        """The call being read is not a call: its raw text becomes content."""
        self.emit("".join(self.raw))
        self.raw = []
        self.mode = TEXT
        self._after_call = False
        return False

    def resume_text(self) -> bool:
        """Go to text mode with ``raw`` (leading whitespace) held as if text mode had read it,
        handing the current character back."""
        self._pending = "".join(self.raw)
        self.raw = []
        self.mode = TEXT
        return False

    def committed(self, mode: str) -> None:
        """A call completed; ``mode`` reads what may follow it (separators, closing tags)."""
        self.raw = []
        self._dropped = ""
        self.mode = mode
        self._committed = True

    def to_text(self) -> bool:
        """Leave for text mode after completed calls, handing the current character back."""
        self.raw = []
        self.mode = TEXT
        self._after_call = True
        return False

    def new_object(self) -> None:
        self._obj = CallObject(self.log)

    def object_char(self, ch: str, done_mode: str) -> bool:
        """Feed a call object; on completion go to ``done_mode``."""
        step = self._obj.push(ch, self.out)
        if step is Step.FAIL:
            return self.fail()
        self.raw.append(ch)
        if step is Step.DONE:
            self.committed(done_mode)
        return True

    def array_char(self, ch: str, after_mode: str) -> bool:
        """Modes ``array`` (after "["), ``array-obj``, ``array-sep``: a list of call objects
        separated by commas; ``after_mode`` reads what follows the closing "]"."""
        if self.mode == "array-obj":
            return self.object_char(ch, "array-sep")
        self.raw.append(ch)
        if ch in WHITESPACE:
            return True
        if self.mode == "array" and ch == "{":
            self.new_object()
            self.raw.pop()
            self.mode = "array-obj"
            return self.object_char(ch, "array-sep")
        if self.mode == "array-sep" and ch == ",":
            self.mode = "array"
            return True
        if self.mode == "array-sep" and ch == "]":
            self.committed(after_mode)
            return True
        self.raw.pop()
        return self.fail()

    # -- internals --------------------------------------------------------------------------

    def _take(self) -> list[Event]:
        out, self.out = self.out, []
        return out

    def _text(self, text: str) -> str:
        """Text mode; returns what follows a call marker (mode changed), else ""."""
        text = self._pending + text
        self._pending = ""
        if self._after_call:
            stripped = text.lstrip(WHITESPACE)
            self._dropped += text[: len(text) - len(stripped)]
            if not stripped:
                return ""
            text = stripped
            self._after_call = False
            if self.marker is None or not self.marker.startswith(text[: len(self.marker)]):
                self._dropped = ""
        marker = self.marker
        at = text.find(marker) if marker else -1
        if marker and at >= 0:
            before = text[:at]
            kept = before.rstrip(WHITESPACE)
            self.emit(kept)
            self.raw = [self._dropped, before[len(kept) :], marker]
            self._dropped = ""
            self.enter_call()
            return text[at + len(marker) :]
        keep = partial_suffix(text, marker) if marker else 0
        body = text[: len(text) - keep]
        kept = body.rstrip(WHITESPACE)
        if kept:
            self._dropped = ""
        self.emit(kept)
        self._pending = body[len(kept) :] + text[len(body) :]
        return ""

    def enter_call(self) -> None:
        """The marker was seen (stages with a marker override this)."""
        raise NotImplementedError

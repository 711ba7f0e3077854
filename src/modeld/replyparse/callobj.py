"""Streaming parse of one tool call: a ``{"name": …, "arguments": {…}}`` object, or an arguments
object alone when the name came before it (Mistral's ``name[ARGS]{…}``).

Why character by character: ``ToolCallStart`` goes out as soon as the name is known and the
arguments' raw JSON text flows out as it arrives, so a client sees the call being written. A call
found malformed half-way reports FAIL; the caller then emits its raw text as content.
"""

from __future__ import annotations

import enum

from modeld.replyparse.events import (
    CallLog,
    Event,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
)
from modeld.replyparse.jsonscan import WHITESPACE, Scan, StringReader, ValueScanner, parse_object

#: Keys that hold the arguments object (Llama 3.x writes "parameters").
ARG_KEYS = ("arguments", "parameters")
#: Other keys a call object may carry, whose values are ignored (Mistral Nemo writes "id").
IGNORED_KEYS = ("id", "type")


class Step(enum.Enum):
    MORE = "more"  # consumed, the call goes on
    DONE = "done"  # consumed, the call is complete (ToolCallEnd emitted)
    FAIL = "fail"  # not consumed: the text so far is not a valid call


class _S(enum.Enum):
    OPEN = 0  # before "{"
    KEY_OR_CLOSE = 1  # after "{"
    KEY_NEXT = 2  # after ","
    KEY = 3
    COLON = 4
    VALUE = 5
    NAME = 6
    ARGS = 7
    SKIP = 8
    AFTER = 9  # after a value: "," or "}"


class ArgsStream:
    """The arguments object of a call whose name is known: emits Start at once, then each
    character of the object as ToolCallArgs, then End once the object closes and parses."""

    def __init__(self, log: CallLog, name: str, out: list[Event]) -> None:
        self._log = log
        self._name = name
        self._index, self._id = log.begin()
        out.append(ToolCallStart(self._index, self._id, name))
        self._scan: ValueScanner | None = None
        self._raw: list[str] = []

    def push(self, ch: str, out: list[Event]) -> Step:
        if self._scan is None:
            if ch in WHITESPACE:
                return Step.MORE
            if ch != "{":
                return Step.FAIL
            self._scan = ValueScanner()
        result = self._scan.push(ch)
        if result is Scan.ERROR:
            return Step.FAIL
        self._raw.append(ch)
        out.append(ToolCallArgs(self._index, ch))
        if result is Scan.DONE:
            arguments = "".join(self._raw)
            if not parse_object(arguments):
                return Step.FAIL
            call = self._log.complete(self._index, self._id, self._name, arguments)
            out.append(ToolCallEnd(call))
            return Step.DONE
        return Step.MORE


class CallObject:
    """A ``{"name": "f", "arguments": {…}}`` object (``"parameters"`` also accepted; ``"id"``
    and ``"type"`` ignored; any other key, a non-string name, non-object arguments or a missing
    name or arguments make it not a call). When the arguments come before the name, the call is
    buffered and Start/Args/End go out together when the object closes."""

    def __init__(self, log: CallLog) -> None:
        self._log = log
        self._state = _S.OPEN
        self._reader = StringReader()
        self._key = ""
        self._seen: set[str] = set()
        self._name: str | None = None
        self._index = -1
        self._id = ""
        self._started = False
        self._scan = ValueScanner()
        self._args: list[str] = []
        self._args_done = False

    def push(self, ch: str, out: list[Event]) -> Step:
        state = self._state
        if state in (_S.OPEN, _S.KEY_OR_CLOSE, _S.KEY_NEXT, _S.COLON, _S.VALUE, _S.AFTER):
            if ch in WHITESPACE:
                return Step.MORE
            return self._structural(ch, out)
        if state is _S.KEY:
            if self._reader.push(ch):
                key = self._reader.value()
                if key is None or key in self._seen:
                    return Step.FAIL
                if key not in ("name", *ARG_KEYS, *IGNORED_KEYS):
                    return Step.FAIL
                if key in ARG_KEYS and self._seen & set(ARG_KEYS):
                    return Step.FAIL
                self._key = key
                self._seen.add(key)
                self._state = _S.COLON
            return Step.MORE
        if state is _S.NAME:
            if self._reader.push(ch):
                self._name = self._reader.value()
                if not self._name:
                    return Step.FAIL
                if not self._seen & set(ARG_KEYS):
                    self._index, self._id = self._log.begin()
                    self._started = True
                    out.append(ToolCallStart(self._index, self._id, self._name))
                self._state = _S.AFTER
            return Step.MORE
        if state is _S.ARGS:
            result = self._scan.push(ch)
            if result is Scan.ERROR:
                return Step.FAIL
            self._args.append(ch)
            if self._started:
                out.append(ToolCallArgs(self._index, ch))
            if result is Scan.DONE:
                if not parse_object("".join(self._args)):
                    return Step.FAIL
                self._args_done = True
                self._state = _S.AFTER
            return Step.MORE
        # _S.SKIP: the value of an ignored key
        result = self._scan.push(ch)
        if result is Scan.ERROR:
            return Step.FAIL
        if result is Scan.ENDED:
            self._state = _S.AFTER
            return self.push(ch, out)
        if result is Scan.DONE:
            self._state = _S.AFTER
        return Step.MORE

    def _structural(self, ch: str, out: list[Event]) -> Step:
        state = self._state
        if state is _S.OPEN:
            if ch != "{":
                return Step.FAIL
            self._state = _S.KEY_OR_CLOSE
        elif state in (_S.KEY_OR_CLOSE, _S.KEY_NEXT):
            if ch != '"':
                return Step.FAIL  # "{}" and trailing commas are not calls
            self._reader = StringReader()
            self._state = _S.KEY
        elif state is _S.COLON:
            if ch != ":":
                return Step.FAIL
            self._state = _S.VALUE
        elif state is _S.VALUE:
            return self._value(ch, out)
        elif ch == ",":  # _S.AFTER
            self._state = _S.KEY_NEXT
        elif ch == "}":
            return self._close(out)
        else:
            return Step.FAIL
        return Step.MORE

    def _value(self, ch: str, out: list[Event]) -> Step:
        if self._key == "name":
            if ch != '"':
                return Step.FAIL
            self._reader = StringReader()
            self._state = _S.NAME
            return Step.MORE
        self._scan = ValueScanner()
        if self._key in ARG_KEYS:
            if ch != "{":
                return Step.FAIL
            self._state = _S.ARGS
        else:
            self._state = _S.SKIP
        return self.push(ch, out)

    def _close(self, out: list[Event]) -> Step:
        if self._name is None or not self._args_done:
            return Step.FAIL
        arguments = "".join(self._args)
        if not self._started:
            self._index, self._id = self._log.begin()
            out.append(ToolCallStart(self._index, self._id, self._name))
            out.append(ToolCallArgs(self._index, arguments))
        call = self._log.complete(self._index, self._id, self._name, arguments)
        out.append(ToolCallEnd(call))
        return Step.DONE

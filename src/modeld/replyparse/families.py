"""The tool-call syntaxes of the common model families, as ``Stage`` subclasses.

- hermes (Qwen 2.5/3, Hermes 2 Pro/3):
  ``<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>``, anywhere, any number of times.
- llama3 (Llama 3.1-3.3): the reply is ``{"name": …, "parameters": {…}}`` (or "arguments"),
  optionally after ``<|python_tag|>``, several separated by ";" or newlines.
- mistral: ``[TOOL_CALLS][{…}, …]`` (Nemo) or ``[TOOL_CALLS]name[ARGS]{…}`` (Small 3.2, Devstral;
  also ``name[CALL_ID]id[ARGS]{…}``), after optional text.
- generic (llama-server's fallback, and the grammar-forced shape): the reply is ``{"name": …,
  "arguments": {…}}``, ``{"tool_calls": [{…}, …]}`` or ``{"tool_call": {…}}``.
- plain: tools are off, everything is text.
"""

from __future__ import annotations

from modeld.replyparse.callobj import ArgsStream, Step
from modeld.replyparse.events import CallLog, Event, TextDelta
from modeld.replyparse.jsonscan import WHITESPACE, StringReader
from modeld.replyparse.stage import Stage

PYTHON_TAG = "<|python_tag|>"


class PlainStage(Stage):
    """Tools off: all content is text, passed through at once."""

    def feed(self, text: str) -> list[Event]:
        return [TextDelta(text)] if text else []

    def finish(self) -> list[Event]:
        return []


class HermesStage(Stage):
    """``<tool_call>`` blocks anywhere; also a bare call object that starts the reply (small
    Qwen models sometimes leave the tags out; llama-server accepts it too)."""

    marker = "<tool_call>"
    close = "</tool_call>"

    def __init__(self, log: CallLog) -> None:
        super().__init__(log)
        self._close_seen = ""
        self.mode = "start"

    def enter_call(self) -> None:
        self.new_object()
        self.start("call")

    def char(self, ch: str) -> bool:
        if self.mode == "start":
            if ch in WHITESPACE:
                self.raw.append(ch)
                return True
            if ch != "{":
                return self.resume_text()
            self.enter_call()
        if self.mode == "call":
            if self.object_char(ch, "close"):
                self._close_seen = ""
                return True
            return False
        # mode "close": optional whitespace, then </tool_call> (a missing one is forgiven)
        if ch in WHITESPACE and not self._close_seen:
            self.raw.append(ch)
            return True
        if self.close.startswith(self._close_seen + ch):
            self._close_seen += ch
            self.raw.append(ch)
            if self._close_seen == self.close:
                return self.to_text() or True
            return True
        seen, self._close_seen = self._close_seen, ""
        self.emit(seen)  # a broken closing tag is text
        return self.to_text()


class MistralStage(Stage):
    marker = "[TOOL_CALLS]"

    def __init__(self, log: CallLog) -> None:
        super().__init__(log)
        self._name = ""
        self._tag = ""
        self._args: ArgsStream | None = None

    def enter_call(self) -> None:
        self._name = ""
        self.start("after-marker")

    def char(self, ch: str) -> bool:
        mode = self.mode
        if mode in ("array", "array-obj", "array-sep"):
            return self.array_char(ch, "after-array")
        if mode == "after-array":
            return self.to_text()
        if mode == "args":
            assert self._args is not None
            step = self._args.push(ch, self.out)
            if step is Step.FAIL:
                return self.fail()
            self.raw.append(ch)
            if step is Step.DONE:
                self.committed("after-array")
            return True
        self.raw.append(ch)
        if mode == "after-marker":
            if ch in WHITESPACE:
                return True
            if ch == "[":
                self.mode = "array"
                return True
            self.mode = "name"
        if self.mode == "name":
            if ch == "[" and self._name:
                self._tag = ch
                self.mode = "tag"
                return True
            if ch in WHITESPACE or ch in '[]{}"':
                return self._unread()
            self._name += ch
            return True
        if self.mode == "call-id":
            if ch == "[":
                self._tag = ch
                self.mode = "args-tag"
            return True
        # modes "tag" (after the name: [ARGS] or [CALL_ID]) and "args-tag" (after the id)
        self._tag += ch
        if self._tag == "[ARGS]":
            self._args = ArgsStream(self.log, self._name, self.out)
            self.mode = "args"
        elif self._tag == "[CALL_ID]" and self.mode == "tag":
            self.mode = "call-id"
        elif not "[ARGS]".startswith(self._tag) and not (
            self.mode == "tag" and "[CALL_ID]".startswith(self._tag)
        ):
            return self._unread()
        return True

    def _unread(self) -> bool:
        self.raw.pop()
        return self.fail()


class Llama3Stage(Stage):
    """Calls only when the reply starts with one (after whitespace); prose stays text."""

    def __init__(self, log: CallLog) -> None:
        super().__init__(log)
        self.mode = "start"
        self._tag_seen = ""

    def char(self, ch: str) -> bool:
        mode = self.mode
        if mode == "call":
            return self.object_char(ch, "between")
        if mode == "tag":
            if PYTHON_TAG.startswith(self._tag_seen + ch):
                self._tag_seen += ch
                self.raw.append(ch)
                if self._tag_seen == PYTHON_TAG:
                    self.mode = "after-tag"
                return True
            return self.fail()
        if ch in WHITESPACE or (mode == "between" and ch == ";"):
            self.raw.append(ch)
            return True
        if ch == "{":
            self.new_object()
            self.start("call")
            return self.object_char(ch, "between")
        if ch == "<" and mode != "after-tag":
            self._tag_seen = ch
            self.raw.append(ch)
            self.start("tag")
            return True
        if mode == "between":
            return self.to_text()
        return self.fail()


class GenericStage(Stage):
    """The whole reply is one JSON object: a call, or a wrapper of calls."""

    def __init__(self, log: CallLog) -> None:
        super().__init__(log)
        self.mode = "start"
        self._head: list[str] = []
        self._key = StringReader()

    def char(self, ch: str) -> bool:
        mode = self.mode
        if mode == "call":
            return self.object_char(ch, "close")
        if mode in ("array", "array-obj", "array-sep"):
            return self.array_char(ch, "close")
        if mode == "key":
            return self._key_char(ch)
        if ch in WHITESPACE:
            self.raw.append(ch)
            if mode == "head":
                self._head.append(ch)
            return True
        if mode == "start":
            if ch != "{":
                return self.fail()
            self._head = [ch]
            self.raw.append(ch)
            self.start("head")
            return True
        if mode == "head":
            if ch != '"':
                return self.fail()
            self._head.append(ch)
            self.raw.append(ch)
            self._key = StringReader()
            self.mode = "key"
            return True
        if mode == "colon" and ch == ":":
            self.raw.append(ch)
            self.mode = "value"
            return True
        if mode == "value" and ch == "[" and self._wrapper == "tool_calls":
            self.raw.append(ch)
            self.mode = "array"
            return True
        if mode == "value" and ch == "{" and self._wrapper == "tool_call":
            self.new_object()
            self.mode = "call"
            return self.object_char(ch, "close")
        if mode == "close" and self._wrapper and ch == "}":
            self._wrapper = ""
            self.committed("close")
            return True
        if mode == "close" and not self._committed:
            return self.fail()
        if mode == "close":
            return self.to_text()
        return self.fail()

    _wrapper = ""  # "tool_calls" or "tool_call" while inside such a wrapper object

    def _key_char(self, ch: str) -> bool:
        self._head.append(ch)
        self.raw.append(ch)
        if not self._key.push(ch):
            return True
        key = self._key.value()
        if key in ("tool_calls", "tool_call"):
            self._wrapper = key
            self.mode = "colon"
            return True
        # a plain call object: replay its beginning into a call parser
        self.new_object()
        for c in self._head:
            if self._obj.push(c, self.out) is Step.FAIL:
                self.raw.pop()
                return self.fail()
        self.mode = "call"
        return True

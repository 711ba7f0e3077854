"""Splits a leading ``<think>…</think>`` block off a streamed reply.

Why: reasoning models (Qwen3, DeepSeek-R1 and its distills, QwQ) write their thinking first; the
front door returns it apart from the content (Ollama's ``thinking``, OpenAI-style
``reasoning_content``). Like llama-server, only a block at the start counts (or one the prompt
already opened), whitespace just inside the tags and right after ``</think>`` is dropped, and a
block never closed is all thinking.
"""

from __future__ import annotations

from modeld.replyparse.jsonscan import WHITESPACE
from modeld.replyparse.stage import partial_suffix

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


class ThinkingSplitter:
    """``feed`` returns (thinking text, content text) of each chunk; thinking always precedes
    content, as the block comes first."""

    def __init__(self, *, start_open: bool = False) -> None:
        self._mode = "lead" if start_open else "start"
        self._held = ""

    def feed(self, text: str) -> tuple[str, str]:
        held, self._held = self._held, ""
        text = held + text
        if self._mode == "start":
            stripped = text.lstrip(WHITESPACE)
            if stripped.startswith(OPEN_TAG):
                self._mode = "lead"
                text = stripped[len(OPEN_TAG) :]
            elif OPEN_TAG.startswith(stripped):
                self._held = text
                return "", ""
            else:
                self._mode = "content"
                return "", text
        if self._mode == "lead":
            text = text.lstrip(WHITESPACE)
            if not text:
                return "", ""
            self._mode = "think"
        if self._mode == "think":
            at = text.find(CLOSE_TAG)
            if at < 0:
                keep = partial_suffix(text, CLOSE_TAG)
                body = text[: len(text) - keep]
                thought = body.rstrip(WHITESPACE)
                self._held = body[len(thought) :] + text[len(body) :]
                return thought, ""
            thought = text[:at].rstrip(WHITESPACE)
            self._mode = "after"
            rest = self.feed(text[at + len(CLOSE_TAG) :])
            return thought, rest[1]
        if self._mode == "after":
            text = text.lstrip(WHITESPACE)
            if not text:
                return "", ""
            self._mode = "content"
        return "", text

    def finish(self) -> tuple[str, str]:
        """Flush at the end: a held partial tag is thinking, a reply that only began like
        ``<think>`` is content."""
        held, self._held = self._held, ""
        if self._mode == "start":
            return "", held
        if self._mode == "think":
            return held.rstrip(WHITESPACE), ""
        return "", ""

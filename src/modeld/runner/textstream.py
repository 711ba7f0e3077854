"""Turning a token stream into safe text chunks, and shaping embeddings (pure, no llama_cpp).

Why: a token may end in the middle of a multi-byte UTF-8 character, and a stop string may
span several tokens. Streaming each token's bytes as they come would emit broken characters
and text that belongs to a stop string. :class:`TextStream` holds back exactly what is not yet
safe to show, and nothing more, so chunks still arrive token by token.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Sequence
from typing import Any


class StopBuffer:
    """Passes text through, holding back only a tail that could still become a stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.hit: str | None = None  # the stop string met (the earliest in the text)

    def feed(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop string was hit).

        On a hit, the text before the earliest stop string is returned and the rest dropped.
        """
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        hits = [(i, s) for s in self.stops if (i := self.pending.find(s)) >= 0]
        if hits:
            at, self.hit = min(hits, key=lambda h: h[0])
            out = self.pending[:at]
            self.pending = ""
            return out, True
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        """The held-back tail, once no more text will come (it did not become a stop)."""
        out, self.pending = self.pending, ""
        return out


class TextStream:
    """Token bytes in, complete text out: UTF-8 reassembly followed by stop-string matching."""

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopBuffer(stops)
        self.stopped = False

    @property
    def stop_hit(self) -> str | None:
        """The stop string that ended the text (None: none did)."""
        return self._stops.hit

    def feed(self, data: bytes) -> str:
        """Text that is safe to emit now; sets ``stopped`` when a stop string was reached."""
        if self.stopped:
            return ""
        out, hit = self._stops.feed(self._decoder.decode(data))
        self.stopped = hit
        return out

    def finish(self) -> str:
        """Everything still held back, at the end of generation (nothing after a stop)."""
        if self.stopped:
            return ""
        out, hit = self._stops.feed(self._decoder.decode(b"", final=True))
        self.stopped = hit
        return out if hit else out + self._stops.flush()


def pool_and_normalize(result: Any) -> list[float]:
    """One L2-normalized vector for one input; per-token rows (no pooling) are mean-pooled."""
    vec: list[float]
    if len(result) and isinstance(result[0], list | tuple):
        rows: list[list[float]] = [list(r) for r in result]
        vec = [sum(col) / len(rows) for col in zip(*rows, strict=True)]
    else:
        vec = [float(x) for x in result]
    norm = math.sqrt(sum(x * x for x in vec))
    return [x / norm for x in vec] if norm > 0 else vec

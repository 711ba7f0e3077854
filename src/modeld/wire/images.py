"""Images in requests (issue 38): their limits, their wire forms and their format, read from the
first bytes. Pure: the HTTP layers, the client protocol and the runner check the same rules,
and the pixels are decoded only in the runner (:mod:`modeld.runner.vision`).

Wire forms: a binary frame beside the message's JSON (:mod:`modeld.wire.frames`: what modeld's
own clients, its HTTP edge and its daemon send), or base64 text in the JSON (what a client
writing JSON by hand may send). Parsed, an image is its file's bytes.

Formats: PNG, JPEG and GIF (its first frame) are decoded by llama.cpp's own stb loader; WebP,
which stb cannot read (llama.cpp's path for it starts ffmpeg), by Pillow in the runner.
"""

from __future__ import annotations

import binascii
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable

MiB = 1024 * 1024
#: Most images one request carries (all its messages together).
MAX_IMAGES = 16
#: Largest image file, in bytes (OpenAI's limit is 20 MB, Anthropic's API 5 MB).
MAX_IMAGE_BYTES = 10 * MiB
#: Most pixels of one image once decoded (4096 x 4096: 48 MiB of RGB).
MAX_PIXELS = 4096 * 4096
FORMATS = ("png", "jpeg", "gif", "webp")
_HINT = "send PNG, JPEG, WebP or GIF images, base64-encoded"
#: The hint once the bytes are in hand (a file from the CLI, a binary frame): no base64 there.
_FORMAT_HINT = "send a PNG, JPEG, WebP or GIF file"
#: Longest base64 text of an image of :data:`MAX_IMAGE_BYTES`.
_MAX_B64 = (MAX_IMAGE_BYTES * 4) // 3 + 4
#: Base64 images kept decoded, by their text (text and bytes counted): an agent resends its
#: screenshots with every turn, and decoding one is ~1 ms per 270 KB of base64 here.
KEPT_DECODED_BYTES = 32 * MiB


class _Decoded:
    """The newest base64 images decoded (:data:`KEPT_DECODED_BYTES`), by their text. Looking
    one up hashes and compares the text: a fifth of decoding it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # the HTTP thread and the daemon's loop both decode

    def get(self, text: str) -> bytes | None:
        with self._lock:
            data = self._items.get(text)
            if data is not None:
                self._items.move_to_end(text)
            return data

    def put(self, text: str, data: bytes) -> None:
        size = len(text) + len(data)
        if size > self.limit:
            return
        with self._lock:
            if text in self._items:
                return
            self._items[text] = data
            self._bytes += size
            while self._bytes > self.limit:
                old, kept = self._items.popitem(last=False)
                self._bytes -= len(old) + len(kept)


_decoded = _Decoded(KEPT_DECODED_BYTES)

Fail = Callable[[str], Exception]


def sniff(data: bytes) -> str | None:
    """The image format of a file's first bytes (one of :data:`FORMATS`), or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def decode_b64(text: str, where: str, fail: Fail) -> bytes:
    """An image's bytes from base64 (a ``data:`` URI's prefix is allowed), checked: size and
    format. Errors name ``where`` and say what to send instead."""
    if text.startswith("data:"):
        head, _, text = text.partition(",")
        if not head.endswith(";base64"):
            raise fail(f"{where} is a data URI that is not base64 ({head[:40]!r}): {_HINT}")
    if len(text) > _MAX_B64:
        raise fail(f"{where} is larger than {MAX_IMAGE_BYTES // MiB} MiB: send a smaller image")
    kept = _decoded.get(text)
    if kept is not None:  # decoded and checked before
        return kept
    try:  # strict: the alphabet and padding only (a third faster than b64decode's validate)
        data = binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raise fail(f"{where} is not valid base64: {_HINT}") from None
    check(data, where, fail)
    _decoded.put(text, data)
    return data


def check(data: bytes, where: str, fail: Fail) -> str:
    """The format of an image's bytes, after checking its size; a clear error otherwise."""
    if not data:
        raise fail(f"{where} is empty: {_FORMAT_HINT}")
    if len(data) > MAX_IMAGE_BYTES:
        raise fail(f"{where} is larger than {MAX_IMAGE_BYTES // MiB} MiB: send a smaller image")
    kind = sniff(data)
    if kind is None:
        raise fail(f"{where} is not a PNG, JPEG, WebP or GIF image: {_FORMAT_HINT}")
    return kind


def check_count(n: int, fail: Fail) -> None:
    if n > MAX_IMAGES:
        raise fail(f"the request has {n} images; at most {MAX_IMAGES} are accepted")


def image_id(data: bytes) -> str:
    """The image's identity in caches: the SHA-256 of its bytes (mtmd's bitmap id too)."""
    return hashlib.sha256(data).hexdigest()


def parse_list(value: object, where: str, fail: Fail) -> tuple[bytes, ...]:
    """A wire list of images (binary frames or base64 text), each checked (an empty or absent
    list: none)."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str | bytes) for v in value):
        raise fail(f"{where} must be a list of base64-encoded images")
    check_count(len(value), fail)
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(decode_b64(item, f"{where}[{i}]", fail))
        else:
            check(item, f"{where}[{i}]", fail)
            out.append(item)
    return tuple(out)

"""Images in the HTTP APIs' messages (issue 38), in modeld's wire form: a message's text, its
``images`` (decoded from base64 here, once: they travel on as binary frames) and where each
sits in the text (``image_at``). Every API's image shape is
read here: OpenAI's ``image_url`` (a data URI; a remote URL is refused by name: modeld
fetches nothing on a request's behalf), the Responses API's ``input_image``, Anthropic's
``image`` block (``source.type`` base64) and Ollama's ``images`` (base64 strings).
"""

from __future__ import annotations

from typing import Any

from modeld.errors import InvalidRequestError
from modeld.wire import images

_REMOTE = ("modeld fetches nothing on a request's behalf: send the image itself, as a "
           "base64 data: URI")  # fmt: skip


def _bad(text: str, hint: str = "see docs/protocol.md") -> InvalidRequestError:
    return InvalidRequestError(text, hint=hint)


class Content:
    """A message's content being read part by part: text, and images at their offsets."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.length = 0
        self.images: list[bytes] = []  # decoded here, once: they travel as binary frames
        self.at: list[int] = []

    def text(self, text: str) -> None:
        self.texts.append(text)
        self.length += len(text)

    def image(self, data: str, where: str) -> None:
        # size, base64 and format checked now: a 400
        self.images.append(images.decode_b64(data, where, _bad))
        self.at.append(self.length)

    def url(self, url: Any, where: str) -> None:
        """An image given by URL: a base64 ``data:`` URI only."""
        if not isinstance(url, str):
            raise _bad(f"{where} must hold the image's URL (a data: URI)")
        if not url.startswith("data:"):
            raise _bad(f"{where} is a remote URL ({url[:60]!r}): {_REMOTE}",
                       hint="encode the image as data:image/png;base64,…")
        self.image(url, where)

    def message(self, role: str, **extra: Any) -> dict[str, Any]:
        """The wire form of the message (``images``/``image_at`` only when it has images)."""
        msg: dict[str, Any] = {"role": role, "content": "".join(self.texts), **extra}
        if self.images:
            msg["images"], msg["image_at"] = self.images, self.at
        return msg


def openai_url(part: dict[str, Any]) -> Any:
    """The URL of an OpenAI ``image_url`` part (``{"url": …}``, or the URL itself)."""
    value = part.get("image_url")
    return value.get("url") if isinstance(value, dict) else value


def anthropic_source(source: Any, where: str) -> str:
    """An Anthropic image block's base64 data (a ``url`` source is refused by name)."""
    if not isinstance(source, dict):
        raise _bad(f"{where}.source must be an object")
    kind = source.get("type")
    if kind == "url":
        raise _bad(f"{where}.source is a URL: {_REMOTE}",
                   hint='send {"type": "base64", "media_type": …, "data": …}')
    if kind != "base64" or not isinstance(source.get("data"), str):
        raise _bad(f"{where}.source must be {{\"type\": \"base64\", \"media_type\", \"data\"}}")
    return str(source["data"])


def ollama_images(value: Any, where: str) -> list[bytes]:
    """Ollama's ``images``: a list of base64 strings, each decoded and checked."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(f"{where} must be a list of base64-encoded images")
    images.check_count(len(value), _bad)
    return [images.decode_b64(data, f"{where}[{i}]", _bad) for i, data in enumerate(value)]

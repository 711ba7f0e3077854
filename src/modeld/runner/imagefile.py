"""What the runner reads from an image file before llama.cpp decodes it (issue 38): its size in
pixels from the header (a small file can decode to gigabytes), and WebP's pixels, which
llama.cpp's stb loader cannot read (its own WebP path starts ffmpeg). Pillow, imported on the
first image; only the four accepted formats are opened.
"""

from __future__ import annotations

import io

from modeld.errors import InvalidRequestError
from modeld.wire import images

_PIL_FORMATS = {"png": "PNG", "jpeg": "JPEG", "gif": "GIF", "webp": "WEBP"}


def _open(data: bytes, kind: str, where: str):  # type: ignore[no-untyped-def]
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(data), formats=[_PIL_FORMATS[kind]])
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InvalidRequestError(f"{where} could not be read as {kind.upper()}: {exc}",
                                  hint="send a valid PNG, JPEG, WebP or GIF file") from None


def check_pixels(data: bytes, kind: str, where: str) -> None:
    """Refuse an image whose header says it is larger than :data:`images.MAX_PIXELS`."""
    with _open(data, kind, where) as img:
        width, height = img.size
    if width * height > images.MAX_PIXELS:
        raise InvalidRequestError(
            f"{where} is {width}x{height} pixels; at most {images.MAX_PIXELS} pixels are "
            "accepted", hint="send a smaller image (the model resizes it anyway)")


def decode_webp(data: bytes, where: str) -> tuple[int, int, bytes]:
    """A WebP image's first frame as (width, height, RGB bytes)."""
    with _open(data, "webp", where) as img:
        try:
            rgb = img.convert("RGB")
        except (OSError, ValueError) as exc:
            raise InvalidRequestError(f"{where} could not be decoded as WEBP: {exc}",
                                      hint="send a valid PNG, JPEG, WebP or GIF file") from None
        return rgb.width, rgb.height, rgb.tobytes()

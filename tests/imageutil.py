"""Small test images in every accepted format (Pillow writes them), and their base64."""

from __future__ import annotations

import base64
import io

import numpy as np


def noise(seed: int, size: int = 40, fmt: str = "PNG") -> bytes:
    """A ``size`` square of random colours (distinct seeds: distinct images) as ``fmt``:
    PNG, JPEG, GIF (two frames: the first is the image) or WEBP."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    img = Image.fromarray(pixels)
    buf = io.BytesIO()
    if fmt == "GIF":
        other = Image.fromarray(255 - pixels)
        img.save(buf, "GIF", save_all=True, append_images=[other])
    elif fmt == "WEBP":
        img.save(buf, "WEBP", lossless=True)
    else:
        img.save(buf, fmt)
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"

"""Binary values beside a message's JSON frame (jupyter_client's "buffers"): a ``bytes`` value
anywhere in a message travels as a ZeroMQ frame of its own after the JSON frame, named there
by ``{"$frame": N}`` (N counts from 0, the first frame after the JSON one); decoding puts the
bytes back where a binary value may stand (an ``images`` list). Both wires (client <-> daemon,
daemon <-> runner) encode with it.

Why: images (issue 38) in base64 inside the JSON were encoded, decoded and copied at every
hop, about 1 ms per 200 KB each on a 2-core EPYC: ~10 ms of every image request in the daemon
and the runner. As frames they are decoded once, where they enter (the HTTP edge, or not at
all from the CLI), and read from the runner's socket as they are.

Pure: json only. A message without bytes is one frame, exactly as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any


class FrameError(ValueError):
    """Binary frames that do not match their JSON frame."""


#: The key of the object that stands for a binary frame in the JSON frame.
FRAME_KEY = "$frame"


def dumps(value: Any) -> list[bytes]:
    """The frames of ``value``: its JSON (compact, NaN/inf refused: ValueError), then each
    ``bytes`` value found in it, in the order the JSON names them."""
    binary: list[bytes] = []

    def frame_of(obj: object) -> dict[str, int]:
        if isinstance(obj, bytes | bytearray | memoryview):
            binary.append(bytes(obj) if isinstance(obj, memoryview) else obj)  # type: ignore[arg-type]
            return {FRAME_KEY: len(binary) - 1}
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    head = json.dumps(value, separators=(",", ":"), allow_nan=False, default=frame_of)
    return [head.encode("utf-8"), *binary]


def loads(head: bytes, binary: Sequence[bytes],
          parse_constant: Callable[[str], Any] | None = None) -> Any:
    """The value of a JSON frame ``head`` with its ``binary`` frames put back where it names
    them: in :func:`_holders` only, so an object ``{"$frame": 0}`` that a user wrote elsewhere
    (a tool's arguments) stays what it is. ValueError (json's own, or: a name out of range, a
    frame named twice or never: :class:`FrameError`): what the callers turn into protocol errors."""
    value = json.loads(bytes(head).decode("utf-8"), parse_constant=parse_constant)
    if not binary:
        return value
    used: set[int] = set()
    for holder in _holders(value):
        for i, item in enumerate(holder):
            if isinstance(item, dict) and FRAME_KEY in item:
                holder[i] = _take(item, binary, used)
    if len(used) != len(binary):
        unused = min(set(range(len(binary))) - used)
        raise FrameError(f"binary frame {unused} is not named where a frame may stand "
                         f'(an "images" list, as {{"{FRAME_KEY}": N}})')
    return value


def _holders(value: Any) -> Iterator[list[Any]]:
    """The lists whose items may be binary frames: a message's ``images`` and those of each
    of its ``messages`` (the only binary values modeld sends)."""
    if not isinstance(value, dict):
        return
    messages = value.get("messages")
    for holder in (value, *(messages if isinstance(messages, list) else ())):
        found = holder.get("images") if isinstance(holder, dict) else None
        if isinstance(found, list):
            yield found


def _take(ref: dict[str, Any], binary: Sequence[bytes], used: set[int]) -> bytes:
    index = ref[FRAME_KEY]
    if len(ref) != 1 or type(index) is not int or not 0 <= index < len(binary):
        raise FrameError(f"{json.dumps(ref)[:80]} names no binary frame "
                         f"(the message has {len(binary)})")
    if index in used:
        raise FrameError(f"binary frame {index} is named twice")
    used.add(index)
    return bytes(binary[index])

"""Binary frames beside the JSON frame (modeld.wire.frames): images travel as bytes on both
wires, are put back only where an image may stand, and frames that do not match their JSON
are a protocol error that names the problem."""

from __future__ import annotations

import base64
import json

import pytest

from modeld.wire import frames, protocol, reqparse, runnerwire
from modeld.wire.messages import ChatMessage

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
GIF = b"GIF89a" + bytes(64)


def _head(parts: list[bytes]) -> dict[str, object]:
    value = json.loads(parts[0])
    assert isinstance(value, dict)
    return value


def test_a_message_without_bytes_is_one_json_frame_as_before() -> None:
    value = {"type": "chunk", "text": "héllo", "n": [1, 2.5, None]}
    assert frames.dumps(value) == [json.dumps(value, separators=(",", ":")).encode()]
    assert frames.loads(frames.dumps(value)[0], []) == value


def test_images_travel_as_frames_in_the_order_the_json_names_them() -> None:
    msg = protocol.request("generate", "r1", model="m", messages=[
        {"role": "user", "content": "look", "images": [PNG, GIF]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "again", "images": [GIF]},
    ])  # fmt: skip
    parts = protocol.encode(msg)
    assert parts[1:] == [PNG, GIF, GIF]
    head = _head(parts)
    assert head["messages"][0]["images"] == [{"$frame": 0}, {"$frame": 1}]  # type: ignore[index]
    assert b"PNG" not in parts[0]  # no base64 copy in the JSON either
    req = reqparse.parse_request(protocol.decode(parts))
    assert isinstance(req, reqparse.GenerateRequest) and req.messages is not None
    assert [m.images for m in req.messages] == [(PNG, GIF), (), (GIF,)]


def test_base64_images_in_the_json_are_still_read_as_the_same_bytes() -> None:
    body = {"v": 1, "id": "r2", "type": "generate", "model": "m", "prompt": "x",
            "images": [base64.b64encode(PNG).decode(),
                       "data:image/gif;base64," + base64.b64encode(GIF).decode()]}
    req = reqparse.parse_request(protocol.decode([json.dumps(body).encode()]))
    assert isinstance(req, reqparse.GenerateRequest)
    assert req.images == (PNG, GIF)


def test_an_object_a_user_wrote_like_a_frame_name_stays_what_it_is() -> None:
    """Only an images list holds frames: a tool's arguments that look like one are not
    replaced, even in a message that has binary frames."""
    args = {"$frame": 0}
    msg = protocol.request("generate", "r3", model="m", messages=[
        {"role": "user", "content": "see", "images": [PNG]},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": args}]},
    ])  # fmt: skip
    req = reqparse.parse_request(protocol.decode(protocol.encode(msg)))
    assert isinstance(req, reqparse.GenerateRequest) and req.messages is not None
    assert req.messages[0].images == (PNG,)
    assert dict(req.messages[1].tool_calls[0].arguments) == args


@pytest.mark.parametrize(
    ("images", "extra", "needle"),
    [
        ([{"$frame": 1}], [PNG], "names no binary frame"),
        ([{"$frame": "0"}], [PNG], "names no binary frame"),
        ([{"$frame": 0, "x": 1}], [PNG], "names no binary frame"),
        ([{"$frame": 0}, {"$frame": 0}], [PNG], "named twice"),
        ([{"$frame": 0}], [PNG, GIF], "frame 1 is not named"),
        ([], [PNG], "frame 0 is not named"),
    ],
)
def test_frames_that_do_not_match_their_json_are_a_protocol_error(
    images: list[object], extra: list[bytes], needle: str
) -> None:
    body = {"v": 1, "id": "r4", "type": "generate", "model": "m", "prompt": "x",
            "images": images}
    with pytest.raises(protocol.ProtocolError, match=needle) as info:
        protocol.decode([json.dumps(body).encode(), *extra])
    assert info.value.request_id == "r4"


def test_a_frame_that_is_no_image_is_refused_by_name() -> None:
    body = {"v": 1, "id": "r5", "type": "generate", "model": "m", "prompt": "x",
            "images": [{"$frame": 0}]}
    msg = protocol.decode([json.dumps(body).encode(), b"%PDF-1.7"])
    with pytest.raises(Exception, match=r"'images'\[0\] is not a PNG, JPEG, WebP or GIF"):
        reqparse.parse_request(msg)


def test_the_runner_wire_carries_images_as_frames_with_a_per_frame_limit() -> None:
    msg = runnerwire.generate("r6", messages=(ChatMessage("user", "hi", images=(PNG,)),))
    parts = runnerwire.encode(msg)
    assert parts[1:] == [PNG]
    back = runnerwire.decode(parts)
    assert back["messages"][0]["images"] == [PNG]
    # each frame is held to the limit, as the runner socket's ZMQ_MAXMSGSIZE holds it
    assert runnerwire.decode(parts, max_bytes=max(len(p) for p in parts))
    with pytest.raises(protocol.ProtocolError, match="exceeds"):
        runnerwire.decode(parts, max_bytes=len(PNG) - 1)
    with pytest.raises(protocol.ProtocolError, match="binary frames do not match"):
        runnerwire.decode([*parts, GIF])  # a frame named nowhere


def test_a_base64_image_sent_again_is_not_decoded_again() -> None:
    """An agent resends its screenshots every turn: the HTTP edge keeps the newest decoded,
    by their text (wire/images.py); a bad text is refused every time, never kept."""
    from modeld.wire import images

    text = base64.b64encode(PNG + b"again").decode()
    first = images.decode_b64(text, "x", ValueError)
    assert first == PNG + b"again"
    assert images.decode_b64("data:image/png;base64," + text, "x", ValueError) is first
    for _ in range(2):
        with pytest.raises(ValueError, match="not valid base64"):
            images.decode_b64(text[:-3] + "!!!", "y", ValueError)
    kept = images._Decoded(limit=3 * (8 + 6))  # three 8-letter texts of 6 bytes
    for i in range(4):
        kept.put(f"text{i:04d}", bytes([i]) * 6)
    assert kept.get("text0000") is None  # the oldest went
    assert kept.get("text0001") == bytes([1]) * 6
    kept.put("text0004", bytes(6))  # 0001 was just used: 0002 goes
    assert kept.get("text0002") is None and kept.get("text0001") is not None
    kept.put("x" * 40, b"too big for the limit")
    assert kept.get("x" * 40) is None

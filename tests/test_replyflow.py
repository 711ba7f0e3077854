"""The reply rules every client shares (modeld.wire.replyflow): pure, fed objects as from a
socket."""

from __future__ import annotations

import json

import pytest

from modeld.cli import fastwire
from modeld.errors import ModelNotFoundError, ProtocolMismatchError
from modeld.wire import protocol
from modeld.wire.replyflow import PROTOCOL_VERSION, ReplyStream, body_of, envelope


def _reply(kind: str, rid: str = "r-1", **body: object) -> dict[str, object]:
    return envelope(kind, rid, body)


def test_a_request_reads_its_chunks_then_its_done_and_skips_others() -> None:
    replies = ReplyStream("r-1")
    assert replies.feed(_reply("chunk", "r-0", text="late")) is None  # an abandoned request's
    assert replies.feed(None) is None  # an unreadable frame that is nobody's
    assert replies.feed(_reply("chunk", text="Hel")) == ("chunk", {"text": "Hel"})
    assert not replies.finished
    assert replies.feed(_reply("done", tokens=3)) == ("done", {"tokens": 3})
    assert replies.finished


def test_an_error_reply_is_raised_as_its_typed_error() -> None:
    replies = ReplyStream("r-1")
    err = ModelNotFoundError("no such model", hint="modeld list")
    with pytest.raises(ModelNotFoundError, match="no such model") as caught:
        replies.feed(envelope("error", "r-1", err.to_dict()))
    assert caught.value.hint == "modeld list"
    assert replies.finished


@pytest.mark.parametrize(
    "bad",
    [
        {"v": 2, "id": "r-1", "type": "done"},  # another protocol version
        {"v": PROTOCOL_VERSION, "id": "r-1", "type": "progress"},  # a type this client lacks
        {"id": "r-1"},  # ours, but no header
    ],
)
def test_a_reply_to_this_request_it_cannot_read_is_a_mismatch(bad: dict[str, object]) -> None:
    with pytest.raises(ProtocolMismatchError, match="cannot read"):
        ReplyStream("r-1").feed(bad)


def test_anything_after_the_end_is_a_mismatch() -> None:
    replies = ReplyStream("r-1")
    replies.feed(_reply("done"))
    with pytest.raises(ProtocolMismatchError):
        replies.feed(_reply("chunk", text="more"))


def test_every_client_builds_the_same_frame() -> None:
    """protocol.encode (client.py, bridge.py) and the fast path's dumps give equal objects."""
    built = protocol.encode(protocol.request("generate", "r-1", model="m", options={"seed": 1}))
    fast = fastwire.dumps(envelope("generate", "r-1", {"model": "m", "options": {"seed": 1}}))
    assert json.loads(built[0]) == json.loads(fast)
    assert body_of(json.loads(fast)) == {"model": "m", "options": {"seed": 1}}
    assert protocol.reply_object([b"{\"v\":1}"]) == {"v": 1}
    assert protocol.reply_object([b"\xff"]) is None

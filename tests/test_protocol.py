"""Client protocol v1: round-trips, validation, and rejection of malformed input (pure)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from modeld.errors import (
    CancelledError,
    ContextExceededError,
    InvalidRequestError,
    ProtocolMismatchError,
    error_from_dict,
)
from modeld.wire import protocol, reqparse
from modeld.wire.messages import ChatMessage


def _frames(obj: object) -> list[bytes]:
    return [json.dumps(obj).encode()]


@pytest.mark.parametrize(
    "msg",
    [
        protocol.request("ping", "1"),
        protocol.request("generate", "a-2", model="m", prompt="hi", options={"max_tokens": 4}),
        protocol.request("embed", "3", model=None, inputs=["a", "b"]),
        protocol.chunk("4", "héllo \u2603"),
        protocol.done("5", finish_reason="stop", timings={"load_s": 0.5}),
        protocol.error_reply("6", CancelledError("stopped", hint="h", details={"n": 1})),
    ],
)
def test_round_trip(msg: protocol.Message) -> None:
    back = protocol.decode(protocol.encode(msg))
    assert back == msg


def test_request_drops_none_values() -> None:
    msg = protocol.request("generate", "1", model=None, prompt="x")
    assert "model" not in msg.body
    assert reqparse.parse_request(msg) == reqparse.GenerateRequest(
        model=None, prompt="x", options=reqparse.GenerateOptions()
    )


def test_error_reply_rebuilds_typed_error() -> None:
    err = ContextExceededError("too long", hint="shorten", details={"prompt_tokens": 9})
    back = protocol.decode(protocol.encode(protocol.error_reply("x", err)))
    rebuilt = error_from_dict(back.body)
    assert isinstance(rebuilt, ContextExceededError)
    assert (rebuilt.message, rebuilt.hint, rebuilt.details) == (
        "too long",
        "shorten",
        {"prompt_tokens": 9},
    )


def test_delimiter_frame_is_tolerated() -> None:
    assert protocol.decode([b"", *_frames({"v": 1, "id": "1", "type": "ping"})]).type == "ping"


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b"{}", b"{}"],
        [b"\xff\xfe"],
        [b"not json"],
        [b"[1, 2]"],
        [b'{"v": 1, "id": "1", "type": "ping", "x": NaN}'],
        _frames({"v": 1, "type": "ping"}),
        _frames({"v": 1, "id": "", "type": "ping"}),
        _frames({"v": 1, "id": 7, "type": "ping"}),
        _frames({"v": 1, "id": "x" * 200, "type": "ping"}),
        _frames({"v": 1, "id": "1", "type": 3}),
        [b"[" * 100_000],
    ],
)
def test_malformed_frames_raise_protocol_error(frames: list[bytes]) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(frames)


def test_version_mismatch_carries_request_id() -> None:
    with pytest.raises(protocol.VersionMismatchError) as info:
        protocol.decode(_frames({"v": 2, "id": "abc", "type": "ping"}))
    assert info.value.request_id == "abc"
    assert isinstance(info.value, ProtocolMismatchError)
    with pytest.raises(protocol.VersionMismatchError):
        protocol.decode(_frames({"id": "abc", "type": "ping"}))


def test_protocol_error_carries_request_id_when_readable() -> None:
    msg = protocol.decode(_frames({"v": 1, "id": "r1", "type": "bogus"}))
    with pytest.raises(protocol.ProtocolError) as info:
        reqparse.parse_request(msg)
    assert info.value.request_id == "r1"
    assert "bogus" in info.value.message


def test_encode_refuses_nan() -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.encode(protocol.done("1", x=float("nan")))


def _parse(type_: str, **body: object) -> reqparse.ParsedRequest:
    return reqparse.parse_request(protocol.Message(type_, "id1", dict(body)))


def test_parse_generate_options() -> None:
    req = _parse(
        "generate",
        model="m",
        prompt="p",
        keep_alive="10m",
        options={"max_tokens": 5, "temperature": 0, "stop": "\n", "seed": 3, "n_ctx": 512},
    )
    assert isinstance(req, reqparse.GenerateRequest)
    o = req.options
    s = o.sampling
    assert (s.max_tokens, s.temperature, s.stop, s.seed, o.n_ctx, o.keep_alive) == (
        5,
        0.0,
        ("\n",),
        3,
        512,
        "10m",
    )


def test_generate_stream_defaults_on_and_must_be_a_boolean() -> None:
    assert _parse("generate", prompt="p").stream is True  # type: ignore[union-attr]
    assert _parse("generate", prompt="p", stream=False).stream is False  # type: ignore[union-attr]
    with pytest.raises(protocol.ProtocolError):
        _parse("generate", prompt="p", stream="no")


def test_parse_chat_messages() -> None:
    req = _parse("generate", messages=[{"role": "user", "content": "hi", "extra": 1}])
    assert isinstance(req, reqparse.GenerateRequest)
    assert req.messages == (ChatMessage("user", "hi"),)


@pytest.mark.parametrize(
    ("type_", "body", "needle"),
    [
        ("generate", {}, "exactly one"),
        ("generate", {"prompt": "a", "messages": [{"role": "u", "content": "c"}]}, "exactly one"),
        ("generate", {"prompt": 5}, "'prompt'"),
        ("generate", {"prompt": "a", "options": []}, "'options'"),
        ("generate", {"prompt": "a", "options": {"max_tokens": "5"}}, "max_tokens"),
        ("generate", {"prompt": "a", "options": {"max_tokens": True}}, "max_tokens"),
        ("generate", {"prompt": "a", "options": {"temperature": "hot"}}, "temperature"),
        ("generate", {"prompt": "a", "options": {"top_p": 2}}, "top_p"),
        ("generate", {"prompt": "a", "options": {"stop": [1]}}, "stop"),
        ("generate", {"prompt": "a", "options": {"raw": "yes"}}, "raw"),
        ("generate", {"prompt": "a", "keep_alive": [1]}, "keep_alive"),
        ("generate", {"messages": [{"role": "u"}]}, "messages"),
        ("generate", {"messages": []}, "messages"),
        ("generate", {"messages": [{"role": "wizard", "content": "c"}]}, "messages[0].role"),
        ("generate", {"messages": [{"content": "c"}]}, "messages[0].role"),
        ("generate", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ("generate", {"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ("generate", {"messages": [{"role": "user", "content": {"a": 1}}]}, "content"),
        ("generate", {"messages": [{"role": "assistant", "content": "",
                                    "tool_calls": [{"name": "f", "arguments": "{x"}]}]},
         "tool_calls[0].arguments"),
        ("generate", {"prompt": "a", "options": {"max_tokens": 0}}, "max_tokens"),
        ("generate", {"prompt": "a", "options": {"min_p": 2}}, "min_p"),
        ("generate", {"prompt": "a", "options": {"mirostat": 2}}, "mirostat"),
        ("generate", {"prompt": "a", "options": {"top_logprobs": 3}}, "logprobs"),
        ("generate", {"prompt": "a", "tools": [{"description": "x"}]}, "tools[0]"),
        ("generate", {"prompt": "a", "tools": [{"name": "f"}], "tool_choice": {"name": "g"}},
         "tool_choice"),
        ("generate", {"prompt": "a", "tool_choice": "required"}, "tool_choice"),
        ("generate", {"prompt": "a", "format": "yaml"}, "format"),
        ("generate", {"prompt": "a", "think": "yes"}, "think"),
        ("embed", {"inputs": []}, "inputs"),
        ("embed", {"inputs": [1]}, "inputs"),
        ("load", {"model": "m", "mode": "chat"}, "mode"),
        ("load", {"model": "m", "pinned": 1}, "pinned"),
        ("load", {"model": "m", "n_ctx": -5}, "n_ctx"),
        ("unload", {}, "'all'"),
        ("cancel", {}, "target"),
        ("show", {"model": 3}, "model"),
    ],
)
def test_parse_rejects_wrong_types(type_: str, body: dict[str, object], needle: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        _parse(type_, **body)
    assert needle in info.value.message


def test_parse_simple_types() -> None:
    for t in ("ps", "stats", "ping", "version", "shutdown"):
        assert _parse(t) is None
    assert _parse("embed", inputs="x") == reqparse.EmbedRequest(None, ("x",))
    assert _parse("unload", all=True) == reqparse.UnloadRequest(None, None, True)
    assert _parse("cancel", target="r9") == reqparse.CancelRequest("r9")
    # no mode: the daemon picks what the model is made for (rerank for a reranker)
    assert _parse("load", model="m", pinned=True) == reqparse.LoadRequest(model="m", pinned=True)


def test_protocol_module_is_pure() -> None:
    code = (
        "import sys, modeld.wire.protocol\n"
        "bad = {'zmq', 'llama_cpp', 'psutil', 'pynvml'} & set(sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

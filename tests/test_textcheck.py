"""Text with no UTF-8 form (lone surrogates) is found and named at every entry point."""

from __future__ import annotations

import json

import pytest

from modeld import protocol
from modeld.errors import InvalidRequestError
from modeld.textcheck import bad_text, check_text, decode_utf8, from_argv


def test_bad_text_names_the_field() -> None:
    doc = json.loads('{"model": "m", "messages": [{"role": "user", "content": "ok"},'
                     ' {"role": "user", "content": "x\\ud83d"}]}')
    assert bad_text(doc) == ("messages[1].content", "x\ud83d")
    assert bad_text({"a": ["fine", "😀", "\u0000"], "b": 1}) is None
    assert bad_text(json.loads('{"\\udc80": 1}')) == ("\udc80", "\udc80")


def test_check_text_message_is_sendable() -> None:
    with pytest.raises(InvalidRequestError) as err:
        check_text(json.loads('{"\\udc80key": "v"}'))
    exc = err.value
    json.dumps(exc.to_dict(), ensure_ascii=False).encode("utf-8")  # no surrogate in the reply
    assert "\\udc80" in exc.message and exc.details["field"] == "\\udc80key"


def test_protocol_decode_refuses_a_surrogate_with_the_request_id() -> None:
    frame = b'{"v":1,"id":"r1","type":"generate","prompt":"\\ud83d"}'
    with pytest.raises(protocol.ProtocolError) as err:
        protocol.decode([frame])
    assert err.value.request_id == "r1" and "'prompt'" in err.value.message
    assert protocol.decode([b'{"v":1,"id":"r1","type":"generate","prompt":"\\ud83d\\ude00"}'])


def test_cli_text_from_bytes_and_argv() -> None:
    with pytest.raises(InvalidRequestError, match="offset 3"):
        decode_utf8(b"abc\xe9def", "stdin")
    assert decode_utf8("é".encode(), "stdin") == "é"
    argv = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python hands over such an argv
    with pytest.raises(InvalidRequestError, match="not valid UTF-8"):
        from_argv(argv, "the prompt argument")
    assert from_argv("café", "x") == "café"

"""Text with no UTF-8 form (lone surrogates) is found and named at every entry point."""

from __future__ import annotations

import json

import pytest

from modeld.errors import InvalidRequestError
from modeld.wire import protocol
from modeld.wire.textcheck import bad_text, check_text, decode_utf8, from_argv


def test_bad_text_names_the_field() -> None:
    doc = json.loads('{"model": "m", "messages": [{"role": "user", "content": "ok"},'
                     ' {"role": "user", "content": "x\\ud83d"}]}')
    assert bad_text(doc) == ("messages[1].content", "x\ud83d")
    assert bad_text({"a": ["fine", "😀", "\u0000"], "b": 1}) is None
    assert bad_text(json.loads('{"\\udc80": 1}')) == ("\udc80", "\udc80")


def test_long_lists_are_checked_whole_and_still_name_the_field() -> None:
    """One encode per list or object (no path per leaf): the bad string is still found and
    named, in document order, in containers of any kind."""
    words = [f"w{i}" for i in range(5000)]
    assert bad_text({"enum": words}) is None
    assert bad_text({"enum": [*words, "x\udfff"]}) == ("enum[5000]", "x\udfff")
    assert bad_text({"a": [{"b": "\ud83d"}, "\ude00"]}) == ("a[0].b", "\ud83d")
    assert bad_text({"a": ["\ude00", {"b": "\ud83d"}]}) == ("a[0]", "\ude00")
    assert bad_text({"a": [1, 2.5, None, True, ["ok", "\ud800"]]}) == ("a[4][1]", "\ud800")

    class Sub(dict[str, str]):
        pass

    assert bad_text([Sub(k="\ud800")]) == ("[0].k", "\ud800")
    with pytest.raises(InvalidRequestError):  # depth is still counted through clean lists
        bad_text(json.loads("[" * 70 + '"ok"' + "]" * 70))


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


def _nested(levels: int) -> dict[str, object]:
    doc: dict[str, object] = {"type": "string"}
    for _ in range(levels - 1):
        doc = {"p": doc}
    return doc


def test_nesting_past_the_limit_is_refused_with_its_path() -> None:
    """Issue 35 item 8: deep JSON is a 400 naming the limit (and where), never a RecursionError
    in a later walk; the limit itself still passes."""
    from modeld.wire.textcheck import MAX_DEPTH

    check_text(_nested(MAX_DEPTH))
    with pytest.raises(InvalidRequestError) as err:
        check_text({"tools": [{"parameters": _nested(600)}]})
    assert f"deeper than {MAX_DEPTH} levels" in err.value.message
    assert err.value.message.split(" at ")[1].startswith("tools[0].parameters.p.p")
    assert err.value.details["max_depth"] == MAX_DEPTH
    with pytest.raises(InvalidRequestError, match="deeper than"):
        check_text(_nested(MAX_DEPTH + 1))


def test_protocol_decode_refuses_json_too_deep_to_parse_with_the_request_id() -> None:
    frame = b'{"v":1,"id":"r-7","type":"generate","format":%s}' % (
        b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(protocol.ProtocolError) as err:
        protocol.decode([frame])
    assert err.value.request_id == "r-7" and "deeper than" in err.value.message

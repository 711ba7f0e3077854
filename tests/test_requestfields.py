"""The generate request's one declaration (requestfields, pure) drives all three sides: the
client protocol's parser, the daemon's runner message and the runner's parser."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import pytest

from modeld.runner import specs
from modeld.wire import loadfields, options, protocol, reqparse, requestfields
from modeld.wire import runnerwire as rp
from modeld.wire.messages import Tool
from modeld.wire.protocol import ProtocolError

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(16)).decode()
#: A value other than the default for each kind of check (a new field of a known kind needs none).
SAMPLES: dict[Any, Any] = {
    requestfields.text: "p2",
    requestfields.nonempty: 'root ::= "a"',
    requestfields.maybe_flag: True,
    requestfields._messages: [{"role": "user", "content": "hi"}],
    requestfields._tools: [{"name": "f"}],
    requestfields._wire_choice: "required",
    requestfields._images: [PNG],
    requestfields._tokens: [1, 2],
    requestfields._threads: 3,
}


def _sample(f: dataclasses.Field[Any]) -> dict[str, Any]:
    """A request body where ``f`` has a value other than its default (and what it needs)."""
    check = f.metadata["check"]
    value = (not f.default) if check is requestfields.flag else SAMPLES[check]
    body: dict[str, Any] = {"prompt": "p", f.name: value}
    if f.name == "messages":
        del body["prompt"]
    if f.metadata["only_with"]:
        body[f.metadata["only_with"]] = [{"name": "f"}]
    return body


def test_every_field_has_a_doc_line_and_a_name_of_its_own() -> None:
    for f in requestfields.HOPS[requestfields.RUNNER]:
        assert f.metadata["doc"] and "\n" not in f.metadata["doc"], f.name
    assert not requestfields.NAMES & options.NAMES  # both are top-level keys of one message
    assert not requestfields.NAMES & {"type", "rid", "model", "options", "format"}
    assert {f.name for f in requestfields.HOPS[requestfields.CLIENT]} == {
        f.name for f in dataclasses.fields(requestfields.Asked)}  # fmt: skip


@pytest.mark.parametrize("f", requestfields.ASKED, ids=lambda f: f.name)
def test_a_field_the_client_asks_reaches_the_runner_as_asked(f: dataclasses.Field[Any]) -> None:
    """Client body -> reqparse.parse_request -> the daemon's copy (requestfields.asked) ->
    runnerwire.generate -> specs.parse_generate: the runner sees what the client asked."""
    req = reqparse.parse_request(protocol.request("generate", "1", **_sample(f)))
    assert isinstance(req, reqparse.GenerateRequest)
    assert getattr(req, f.name) != f.default
    wire = rp.decode(rp.encode(rp.generate("r", **requestfields.asked(req))))
    assert f.name in wire
    spec = specs.parse_generate(wire)
    assert getattr(spec, f.name) == getattr(req, f.name)


@pytest.mark.parametrize("f", requestfields.DECIDED, ids=lambda f: f.name)
def test_a_field_the_daemon_decides_reaches_the_runner(f: dataclasses.Field[Any]) -> None:
    value = _sample(f)[f.name]
    spec = specs.parse_generate(rp.generate("r", prompt="p", **{f.name: value}))
    typed = tuple(value) if isinstance(value, list) else value
    assert getattr(spec, f.name) == typed != f.default
    client = reqparse.parse_request(protocol.request("generate", "1", **_sample(f)))
    assert not hasattr(client, f.name) or f.name == "raw"  # raw: the client's options.raw
    with pytest.raises(TypeError, match="unknown generate field 'nope'"):
        rp.generate("r", prompt="p", nope=1)


@pytest.mark.parametrize("hop", [requestfields.CLIENT, requestfields.RUNNER])
def test_a_bad_type_is_refused_naming_the_field(hop: str) -> None:
    for f in requestfields.HOPS[hop]:
        body = {**_sample(f), f.name: {"bad": 1}}
        with pytest.raises(ProtocolError) as caught:
            if hop == requestfields.CLIENT:
                reqparse.parse_request(protocol.request("generate", "1", **body))
            else:
                specs.parse_generate({"type": "generate", "rid": "r", **body})
        assert repr(f.name) in caught.value.message, (f.name, caught.value.message)


def test_defaults_stay_off_the_wire_as_before() -> None:
    """The runner message is what the hand-written builder sent: defaults left out (``raw``
    and ``deterministic`` always sent), ``tool_choice`` only beside tools."""
    sent = rp.generate("r", prompt="p")
    assert set(sent) == {"type", "rid", "raw", "deterministic", "prompt"} | options.NAMES
    assert "tool_choice" not in rp.generate("r", prompt="p", tool_choice="none")
    full = rp.generate("r", messages=[{"role": "user", "content": "x"}], tools=[Tool("f")],
                       tool_choice="function:f", grammar="g", think=False, count_only=True,
                       stream=False, max_tokens=3)  # fmt: skip
    assert {k: v for k, v in full.items() if k not in options.NAMES} == {
        "type": "generate", "rid": "r", "raw": False, "deterministic": False,
        "messages": [{"role": "user", "content": "x"}], "tools": [Tool("f").to_wire()],
        "tool_choice": "function:f", "grammar": "g", "think": False, "count_only": True,
        "stream": False,
    }  # fmt: skip
    assert full["max_tokens"] == 3


def test_exactly_one_of_prompt_or_messages_on_both_sides() -> None:
    for body in ({}, {"prompt": "p", "messages": [{"role": "user", "content": "x"}]}):
        with pytest.raises(ProtocolError, match="exactly one of 'prompt' or 'messages'"):
            reqparse.parse_request(protocol.request("generate", "1", **body))
        with pytest.raises(ProtocolError, match="exactly one of 'prompt' or 'messages'"):
            specs.parse_generate({"type": "generate", "rid": "r", **body})


# --------------------------------------------------------------------------- the runner's load

LOAD_SAMPLES: dict[str, Any] = {
    "path": "/m.gguf", "mode": "embed", "n_ctx": 1024, "n_threads": 2, "n_batch": 256,
    "seed": 5, "chat_format": "gemma", "prompt_cache_mib": 0, "warm_up": False,
    "prompt_cache_dir": "/c", "parallel": 4, "kv_unified": True, "rpc": ["10.0.0.1:50052"],
    "rpc_ctx_floor": 512,
    "rpc_memory": 1 << 30, "gpu_layers": -1, "tensor_split": [1, 2.5], "type_k": "q8_0",
    "type_v": "q4_0", "handoff": "/c/h-1", "handoff_pid": 42, "mmproj": "/p.gguf",
}  # fmt: skip


def test_every_load_field_is_built_by_the_daemon_and_read_by_the_runner() -> None:
    assert set(LOAD_SAMPLES) == {f.name for f in loadfields.FIELDS}  # a new field: add it here
    wire = rp.decode(rp.encode(rp.load(**LOAD_SAMPLES)))
    spec = specs.parse_load(wire)
    for f in loadfields.FIELDS:
        value = LOAD_SAMPLES[f.name]
        assert getattr(spec, f.name) == (tuple(value) if isinstance(value, list) else value)
        assert getattr(spec, f.name) != f.default, f.name
        assert f.metadata["doc"], f.name
    least = rp.load("/m.gguf", n_ctx=512, n_threads=1)  # what every load message carries
    assert set(least) == {"type", "path", "mode", "n_ctx", "n_threads", "n_batch", "seed",
                          "prompt_cache_mib", "warm_up"}  # fmt: skip
    assert "rpc_ctx_floor" not in rp.load("/m.gguf", n_ctx=512, n_threads=1, rpc_ctx_floor=256)
    with pytest.raises(TypeError, match="'n_threads' is required"):
        rp.load("/m.gguf", n_ctx=512)
    with pytest.raises(TypeError, match="unknown load field 'nope'"):
        rp.load("/m.gguf", n_ctx=512, n_threads=1, nope=1)


@pytest.mark.parametrize("f", loadfields.FIELDS, ids=lambda f: f.name)
def test_a_bad_load_field_is_refused_naming_it(f: dataclasses.Field[Any]) -> None:
    msg = {**rp.load(**LOAD_SAMPLES), f.name: {"bad": 1}}
    with pytest.raises(ProtocolError) as caught:
        specs.parse_load(msg)
    assert caught.value.message.startswith("load: ") and repr(f.name) in caught.value.message


# --------------------------------------------------------------------------- the client's load


@pytest.mark.parametrize("f", dataclasses.fields(reqparse.LoadRequest), ids=lambda f: f.name)
def test_the_client_load_request_is_read_from_its_table(f: dataclasses.Field[Any]) -> None:
    """Each field of reqparse.LoadRequest is declared with its check and doc: null or absent
    is "not said" (pinned: absent only), a bad value is refused naming the field."""
    assert f.metadata["doc"]
    said = reqparse.parse_request(protocol.request("load", "1", model="m"))
    assert said == reqparse.LoadRequest(model="m")
    if f.name not in ("pinned", "model"):  # a null model: the default one
        body = {"model": "m", f.name: None}
        assert reqparse.parse_request(protocol.Message("load", "1", body)) == said
    with pytest.raises(ProtocolError) as caught:
        reqparse.parse_request(protocol.request("load", "1", **{"model": "m", f.name: {"x": 1}}))
    assert caught.value.message.startswith("invalid load request: ")
    assert repr(f.name) in caught.value.message

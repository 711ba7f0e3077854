"""Runner wire protocol (pure) and token-stream text handling (pure): round trips, validation,
UTF-8 reassembly and stop strings."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from modeld.errors import ErrorCode
from modeld.runner import specs
from modeld.runner.textstream import StopBuffer, TextStream, pool_and_normalize
from modeld.wire import runnerwire as rp
from modeld.wire.protocol import ProtocolError

# --------------------------------------------------------------------------- protocol

MESSAGES: list[dict[str, Any]] = [
    rp.hello(123, {"rss": 1, "anon": 2, "file": 3}),
    rp.load(
        "/m.gguf", mode="embed", n_ctx=1024, n_threads=2, n_batch=256, seed=5, chat_format="gemma"
    ),
    rp.loaded(
        n_ctx=1024,
        n_ctx_train=32768,
        load_s=0.5,
        warmup_s=0.1,
        chat_format="gemma",
        memory={"rss": 9, "anon": 4, "file": 5},
        footprint={"rss": 8, "anon": 3, "file": 5},
    ),
    rp.load_failed(ErrorCode.INVALID_MODEL, "bad file", "re-download it"),
    rp.generate("r1", messages=[{"role": "user", "content": "héllo ✓"}], stop=["\n"]),
    rp.generate("r2", prompt="raw", raw=True, max_tokens=3, temperature=0.0, seed=-1),
    rp.embed("r3", ["a", "b"]),
    rp.cancel("r1"),
    rp.shutdown(),
    rp.memory_request(),
    rp.memory_reply({"rss": 1, "anon": 1, "file": 0}, {"rss": 0, "anon": 0, "file": 0}),
    rp.chunk("r1", "tok"),
    rp.done_generate(
        "r1",
        finish_reason="length",
        prompt_tokens=5,
        prompt_tokens_reused=4,
        completion_tokens=3,
        prompt_eval_s=0.01,
        generation_s=0.5,
    ),
    rp.done_embed("r3", [[0.6, 0.8]], 2, 0.01),
    rp.error("r1", ErrorCode.CONTEXT_EXCEEDED, "too long", {"prompt_tokens": 9, "n_ctx": 8}),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=[m["type"] for m in MESSAGES])
def test_every_message_round_trips(msg: dict[str, Any]) -> None:
    frames = rp.encode(msg)
    assert len(frames) == 1
    assert rp.decode(frames) == msg
    assert msg["type"] in rp.TO_RUNNER | rp.FROM_RUNNER


def test_built_messages_carry_what_the_contract_names() -> None:
    done = rp.done_generate(
        "r",
        finish_reason="stop",
        prompt_tokens=5,
        prompt_tokens_reused=4,
        completion_tokens=10,
        prompt_eval_s=0.1,
        generation_s=0.5,
    )
    assert done["usage"] == {"prompt_tokens": 5, "prompt_tokens_reused": 4, "completion_tokens": 10}
    assert done["timings"]["tokens_per_s"] == pytest.approx(20.0)
    err = rp.error("r", ErrorCode.CANCELLED, "stopped")
    assert err["code"] == "cancelled" and err["details"] == {}
    assert "chat_format" not in rp.load("/m", n_ctx=256, n_threads=1)


@pytest.mark.parametrize(
    "frames",
    [
        [b"{}"],  # no type
        [b"[1, 2]"],
        [b"\xff\xfe"],
        [b"not json"],
        [b'{"type": "chunk"}', b"{}"],  # two frames
        [b'{"type": "x", "v": NaN}'],
        [b'{"type": 5}'],
    ],
)
def test_decode_rejects_malformed_frames(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError):
        rp.decode(frames)


def test_decode_enforces_the_size_limit_and_encode_refuses_nan() -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        rp.decode([b'{"type":"chunk","text":"' + b"x" * 100 + b'"}'], max_bytes=50)
    with pytest.raises(ProtocolError):
        rp.encode({"type": "done", "x": math.nan})


def test_parse_load_validates_fields() -> None:
    spec = specs.parse_load(rp.load("/m.gguf", n_ctx=512, n_threads=4))
    assert (spec.path, spec.mode, spec.n_ctx, spec.n_threads, spec.n_batch) == (
        "/m.gguf",
        "generate",
        512,
        4,
        512,
    )
    for bad in (
        {"n_ctx": 300},  # not a multiple of 256
        {"n_ctx": 0},
        {"mode": "chat"},
        {"n_threads": 0},
        {"path": ""},
        {"n_ctx": True},
    ):
        msg = {**rp.load("/m.gguf", n_ctx=512, n_threads=1), **bad}
        with pytest.raises(ProtocolError):
            specs.parse_load(msg)


def test_load_carries_the_prompt_cache_size_and_tolerates_its_absence() -> None:
    assert specs.parse_load(rp.load("/m.gguf", n_ctx=512, n_threads=1)).prompt_cache_mib == 32
    zero = rp.load("/m.gguf", n_ctx=512, n_threads=1, prompt_cache_mib=0)
    assert specs.parse_load(zero).prompt_cache_mib == 0
    older = {k: v for k, v in zero.items() if k != "prompt_cache_mib"}  # an older daemon
    assert specs.parse_load(older).prompt_cache_mib == 32
    for bad in (-1, "32", True):
        with pytest.raises(ProtocolError):
            specs.parse_load({**zero, "prompt_cache_mib": bad})


def test_load_warm_up_defaults_on_and_must_be_a_boolean() -> None:
    msg = rp.load("/m.gguf", n_ctx=512, n_threads=1)
    assert specs.parse_load(msg).warm_up is True
    assert specs.parse_load({k: v for k, v in msg.items() if k != "warm_up"}).warm_up is True
    cold = rp.load("/m.gguf", n_ctx=512, n_threads=1, warm_up=False)
    assert specs.parse_load(cold).warm_up is False
    for bad in (0, "no", None):
        with pytest.raises(ProtocolError):
            specs.parse_load({**msg, "warm_up": bad})


def test_load_prompt_cache_dir_is_optional_and_a_path() -> None:
    msg = rp.load("/m.gguf", n_ctx=512, n_threads=1)
    assert "prompt_cache_dir" not in msg and specs.parse_load(msg).prompt_cache_dir is None
    given = rp.load("/m.gguf", n_ctx=512, n_threads=1, prompt_cache_dir="/c/prompts")
    assert specs.parse_load(given).prompt_cache_dir == "/c/prompts"
    for bad in ("", 3, ["/c"]):
        with pytest.raises(ProtocolError):
            specs.parse_load({**msg, "prompt_cache_dir": bad})


def test_parse_generate_validates_fields() -> None:
    spec = specs.parse_generate(rp.generate("r", prompt="p", stop=["a"], top_k=0, seed=3))
    assert spec.prompt == "p" and spec.messages is None and spec.sampling.stop == ("a",)
    assert spec.sampling.top_k == 0 and spec.sampling.seed == 3 and not spec.raw
    one_stop = {"type": "generate", "rid": "r", "prompt": "p", "stop": "x"}
    assert specs.parse_generate(one_stop).sampling.stop == ("x",)
    base = {"type": "generate", "rid": "r", "prompt": "p"}
    for bad in (
        {"prompt": None},  # neither prompt nor messages
        {"messages": [{"role": "user", "content": "x"}]},  # both
        {"max_tokens": 0},
        {"temperature": -1},
        {"temperature": math.inf},
        {"top_p": 2},
        {"stop": [""]},
        {"raw": "yes"},
        {"rid": ""},
        {"stream": "no"},
    ):
        with pytest.raises(ProtocolError):
            specs.parse_generate({**base, **bad})
    with pytest.raises(ProtocolError):
        specs.parse_generate({"type": "generate", "rid": "r", "messages": [{"role": "user"}]})


def test_a_reply_read_whole_is_sent_in_fewer_chunks() -> None:
    """``stream`` false (HTTP ``"stream": false``): the text goes out once a second at most
    (progress for the daemon's stall watch), not every 40 ms; absent means streamed."""
    assert "stream" not in rp.generate("r", prompt="p")
    streamed = specs.parse_generate(rp.generate("r", prompt="p"))
    whole = specs.parse_generate(rp.generate("r", prompt="p", stream=False))
    assert streamed.stream and not whole.stream
    assert streamed.chunk_interval_s == specs.CHUNK_INTERVAL_S == 0.04
    assert whole.chunk_interval_s == specs.QUIET_INTERVAL_S == 1.0


def test_parse_embed_validates_inputs() -> None:
    assert specs.parse_embed(rp.embed("r", ["a"])).inputs == ("a",)
    assert specs.parse_embed({"type": "embed", "rid": "r", "inputs": "a"}).inputs == ("a",)
    for inputs in ([], [1], None):
        with pytest.raises(ProtocolError):
            specs.parse_embed({"type": "embed", "rid": "r", "inputs": inputs})


# --------------------------------------------------------------------------- text stream


def test_multibyte_characters_split_across_tokens_are_never_emitted_broken() -> None:
    data = "é✓😀".encode()
    stream = TextStream()
    out = [stream.feed(data[i : i + 1]) for i in range(len(data))]
    # Bytes that do not complete a character produce nothing; complete ones come out whole.
    assert "".join(out) == "é✓😀"
    assert all(piece in ("", "é", "✓", "😀") for piece in out)
    assert stream.finish() == ""


def test_an_unfinished_character_at_the_end_becomes_a_replacement_char() -> None:
    stream = TextStream()
    assert stream.feed(b"ok\xe2\x9c") == "ok"
    assert stream.finish() == "\ufffd"


def test_stop_string_split_across_tokens_is_held_back_then_dropped() -> None:
    stream = TextStream(stops=["END"])
    assert stream.feed(b"hello E") == "hello "  # "E" might start "END"
    assert stream.feed(b"N") == ""
    assert stream.feed(b"D and more") == ""
    assert stream.stopped
    assert stream.finish() == ""


def test_a_held_back_prefix_that_does_not_become_a_stop_is_released() -> None:
    stream = TextStream(stops=["END"])
    assert stream.feed(b"an E") == "an "
    assert stream.feed(b"xit") == "Exit"
    assert stream.feed(b" EN") == " "
    assert stream.finish() == "EN"  # generation ended: the tail is text after all
    assert not stream.stopped


def test_earliest_of_several_stops_wins() -> None:
    buf = StopBuffer(["\n\n", "User:"])
    assert buf.feed("answer User: x\n\n") == ("answer ", True)


def test_pool_and_normalize() -> None:
    assert pool_and_normalize([3.0, 4.0]) == pytest.approx([0.6, 0.8])
    # Per-token rows (no pooling in the model) are mean-pooled first.
    assert pool_and_normalize([[1.0, 0.0], [5.0, 8.0]]) == pytest.approx([0.6, 0.8])
    assert pool_and_normalize([0.0, 0.0]) == [0.0, 0.0]


def test_per_request_threads_are_optional_and_bounded() -> None:
    base = {"type": "generate", "rid": "r1", "prompt": "hi"}
    assert specs.parse_generate(base).n_threads is None
    assert specs.parse_generate({**base, "n_threads": 3}).n_threads == 3
    embed = {"type": "embed", "rid": "e", "inputs": ["a"], "n_threads": 1}
    assert specs.parse_embed(embed).n_threads == 1
    with pytest.raises(ProtocolError):
        specs.parse_generate({**base, "n_threads": -1})
    with pytest.raises(ProtocolError):
        specs.parse_generate({**base, "n_threads": "two"})


def test_stream_false_reaches_the_runner_from_the_client_protocol(tmp_path: Path) -> None:
    """A client's ``"stream": false`` (what the HTTP front door sends for a reply read whole)
    travels through the daemon's job into the runner's message; absent stays streamed."""
    from modeld.cache.policy import ModelKey
    from modeld.config import Settings
    from modeld.daemon.jobs import request_job
    from modeld.wire import protocol, reqparse

    def runner_spec(**body: Any) -> specs.GenerateSpec:
        req = reqparse.parse_request(protocol.Message("generate", "c1", {"prompt": "p", **body}))
        assert isinstance(req, reqparse.GenerateRequest)
        model = tmp_path / "m.gguf"
        model.write_bytes(b"GGUF")
        job = request_job(b"c", "c1", req, ModelKey.for_file(model, "generate"), "m",
                          Settings())  # fmt: skip
        return specs.parse_generate(job.payload)

    assert runner_spec().stream is True
    assert runner_spec(stream=False).stream is False

"""Faults the daemon must survive: bad model files, crashing runners, hostile or vanishing
clients. After each, the daemon still answers.

Real daemon, real runners, real llama-cpp-python, real ZeroMQ sockets.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

import ggufgen
from daemonutil import rows, until
from modeld.client import Client
from modeld.errors import (
    CancelledError,
    InvalidModelError,
    ModelNotFoundError,
    RunnerCrashedError,
)

pytestmark = pytest.mark.slow

Factory = Callable[..., Any]
LONG = dict(ggufgen.TINY, context_length=32768)


@pytest.fixture(scope="module")
def long_model(model_factory: Factory) -> Path:
    return model_factory("llama", **LONG)


def test_bad_model_files_get_clear_errors(
    daemon_factory: Factory, tiny_model: Path, tmp_path: Path
) -> None:
    d = daemon_factory()
    c = d.client()
    with pytest.raises(ModelNotFoundError):
        c.generate(str(tmp_path / "missing.gguf"), "x").text()
    text_file = tmp_path / "notes.gguf"
    text_file.write_text("this is not a model\n" * 100)
    with pytest.raises(InvalidModelError):
        c.generate(str(text_file), "x").text()
    truncated = tmp_path / "truncated.gguf"
    data = tiny_model.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModelError):
        c.generate(str(truncated), "x").text()
    # a header the reader accepts but llama.cpp rejects: the runner reports load_failed
    alien = tmp_path / "alien.gguf"
    alien.write_bytes(data.replace(b"llama", b"llamb"))
    with pytest.raises(InvalidModelError) as info:
        c.generate(str(alien), "x").text()
    assert "llamb" in str(info.value) or "architecture" in str(info.value)
    assert c.stats()["load_failures"] == 1
    # a second try is answered from the failure record (cool-down), not by another load
    with pytest.raises(InvalidModelError):
        c.generate(str(alien), "x").text()
    assert c.stats()["load_failures"] == 1
    assert c.generate(str(tiny_model), "still fine", max_tokens=2).text() is not None
    assert d.proc.poll() is None


def test_runner_killed_mid_generation(
    daemon_factory: Factory, long_model: Path, tiny_model: Path
) -> None:
    d = daemon_factory()
    setup = d.client()
    setup.load(str(long_model), n_ctx=8192)
    setup.load(str(tiny_model))
    victim_pid = rows(setup)[long_model.name]["runner_pid"]
    other_pid = rows(setup)[tiny_model.name]["runner_pid"]

    # A 2 s reply timeout: the crash must be reported within 2 s of the kill.
    streamer = Client(d.endpoint, timeout=2.0, connect_timeout=10.0)
    stream = iter(streamer.generate(str(long_model), "a", max_tokens=8000, temperature=0))
    assert next(stream)
    os.kill(victim_pid, signal.SIGKILL)
    with pytest.raises(RunnerCrashedError) as info:
        for _ in stream:
            pass
    streamer.close()
    assert "crashed" in info.value.message

    assert setup.generate(str(tiny_model), "other", max_tokens=3).text() is not None
    assert rows(setup)[tiny_model.name]["runner_pid"] == other_pid  # unaffected
    assert setup.generate(str(long_model), "again", max_tokens=3).text() is not None
    new_pid = rows(setup)[long_model.name]["runner_pid"]
    assert new_pid != victim_pid
    assert setup.stats()["evictions"]["crash"] == 1


def _raw(endpoint: str) -> tuple[zmq.Context[Any], zmq.Socket[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(endpoint)
    return ctx, sock


def _reply(sock: zmq.Socket[Any]) -> dict[str, Any]:
    frames = sock.recv_multipart()
    assert len(frames) == 1
    data = json.loads(frames[0])
    assert isinstance(data, dict)
    return data


def test_malformed_input_gets_errors_and_never_crashes(daemon_factory: Factory) -> None:
    d = daemon_factory("--max-message-bytes", "65536")
    ctx, sock = _raw(d.endpoint)
    try:
        cases: list[tuple[list[bytes], str]] = [
            ([b"\xff\x00garbage"], "invalid_request"),
            ([b"[1, 2, 3]"], "invalid_request"),
            ([b"{}", b"{}"], "invalid_request"),
            ([json.dumps({"v": 1, "id": "t1", "type": "teleport"}).encode()], "invalid_request"),
            ([json.dumps({"v": 99, "id": "t2", "type": "ping"}).encode()], "protocol_mismatch"),
            (
                [json.dumps({"v": 1, "id": "t3", "type": "generate", "prompt": 5}).encode()],
                "invalid_request",
            ),
            (
                [
                    json.dumps(
                        {
                            "v": 1,
                            "id": "t4",
                            "type": "generate",
                            "prompt": "x",
                            "options": {"max_tokens": "many"},
                        }
                    ).encode()
                ],
                "invalid_request",
            ),
            ([json.dumps({"v": 1, "id": "t5", "type": "unload"}).encode()], "invalid_request"),
        ]
        for frames, code in cases:
            sock.send_multipart(frames)
            reply = _reply(sock)
            assert reply["type"] == "error", frames
            assert reply["code"] == code, (frames, reply)
            assert reply["message"]
        # ids are echoed when they could be read
        sock.send_multipart([json.dumps({"v": 1, "id": "t6", "type": "bogus"}).encode()])
        assert _reply(sock)["id"] == "t6"
        # an oversized message is dropped by ZeroMQ (the peer is disconnected), nothing else
        sock.send_multipart([b"x" * 200_000])
    finally:
        sock.close(0)
        ctx.term()
    c = d.client()
    assert c.ping()["pid"] == d.proc.pid
    assert d.proc.poll() is None


def test_client_vanishing_mid_stream_frees_the_model(
    daemon_factory: Factory, long_model: Path
) -> None:
    d = daemon_factory()
    watcher = d.client()
    watcher.load(str(long_model), n_ctx=8192)
    leaver = Client(d.endpoint, timeout=30)
    stream = iter(leaver.generate(str(long_model), "a", max_tokens=8000, temperature=0))
    assert next(stream)
    assert rows(watcher)[long_model.name]["in_flight"] == 1
    leaver._sock.close(linger=0)  # vanish without a cancel: no goodbye, like a killed process
    leaver._sock = None
    until(lambda: rows(watcher)[long_model.name]["in_flight"] == 0, what="model released")
    assert watcher.generate(str(long_model), "next", max_tokens=3).text() is not None


def test_explicit_cancel_stops_generation(daemon_factory: Factory, long_model: Path) -> None:
    d = daemon_factory()
    c = d.client()
    gen = c.generate(str(long_model), "a", max_tokens=8000, n_ctx=8192, temperature=0)
    stream = iter(gen)
    assert next(stream)
    c.cancel(gen.request_id)
    with pytest.raises(CancelledError):
        for _ in stream:
            pass
    done = gen.done
    assert done is None
    watcher = d.client()
    until(lambda: rows(watcher)[long_model.name]["in_flight"] == 0, what="model released")
    assert c.generate(str(long_model), "next", max_tokens=3).text() is not None

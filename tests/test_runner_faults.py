"""One request's fault stays that request's (issue 21): a real runner, several sequences.

The daemon refuses lone surrogates before they get here (tests/test_http_faults.py); these
tests send them to the runner directly, as a defence-in-depth check: a request whose text
cannot be encoded for the tokenizer gets its own error, and the stream beside it runs on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from modeld.wire import runnerwire as rp
from test_runner import Harness
from test_runner_batch import _replies

pytestmark = pytest.mark.slow


@pytest.fixture()
def runner() -> Iterator[Harness]:
    h = Harness("f1")
    yield h
    h.close()


def test_an_unencodable_prompt_fails_alone_beside_a_stream(
    runner: Harness, tiny_model: Path
) -> None:
    runner.loaded(tiny_model, n_ctx=512, parallel=4)
    runner.send(rp.generate("long", prompt="once upon a time", raw=True, temperature=0.0,
                            max_tokens=300))
    first = runner.recv()
    assert first["rid"] == "long" and first["type"] == "chunk", first  # streaming now
    runner.send(rp.generate("bad-raw", prompt="x\ud83d", raw=True, max_tokens=5))
    runner.send(rp.generate("bad-chat", messages=[{"role": "user", "content": "\udc80"}],
                            max_tokens=5))
    got = _replies(runner, ["long", "bad-raw", "bad-chat"])
    for rid in ("bad-raw", "bad-chat"):
        final = got[rid][1]
        assert final["type"] == "error" and final["code"] == "invalid_request", final
    done = got["long"][1]
    assert done["type"] == "done" and done["usage"]["completion_tokens"] == 300, done
    # the runner is fine afterwards
    runner.send(rp.generate("after", prompt="hello", raw=True, max_tokens=4))
    assert _replies(runner, ["after"])["after"][1]["type"] == "done"


def test_a_cancel_read_beside_its_generate_is_not_dropped(
    runner: Harness, tiny_model: Path
) -> None:
    """A request and its cancel read between the same two steps (a step that outlasted its
    caller): the request ends ``cancelled`` at once instead of running to its end (the cancel
    was taken for one of a request not running, and dropped)."""
    import os
    import signal

    runner.loaded(tiny_model, n_ctx=512, parallel=4)
    runner.send(rp.generate("long", prompt="once upon a time", raw=True, temperature=0.0,
                            max_tokens=400))
    assert runner.recv()["rid"] == "long"  # streaming: the runner is between steps now
    os.kill(runner.pid, signal.SIGSTOP)  # both messages wait for the same read
    try:
        runner.send(rp.generate("left", prompt="hello", raw=True, max_tokens=300))
        runner.send(rp.cancel("left"))
    finally:
        os.kill(runner.pid, signal.SIGCONT)
    got = _replies(runner, ["long", "left"])
    left = got["left"][1]
    assert left["type"] == "error" and left["code"] == "cancelled", left
    assert got["long"][1]["type"] == "done"

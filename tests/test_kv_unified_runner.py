"""One pool of KV cells shared by the sequences (issue 36, ``kv_unified``) in a real runner:
a prompt longer than its share of a separate layout is served beside a short request; a full
pool frees idle sequences' cells, then ends the request holding the most cells with the reason
a full context gives, and the runner goes on serving. Tiny generated model, real llama.cpp."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modeld.wire import runnerwire as rp
from test_runner import Harness
from test_runner_batch import _opts, _replies

pytestmark = pytest.mark.slow

LONG = "a prompt about stones and rivers " * 11  # about 290 tokens
SHORT = "another prompt, short "  # 20 tokens


@pytest.fixture()
def runner() -> Iterator[Harness]:
    h = Harness("u1")
    yield h
    h.close()


def test_a_unified_load_reports_the_pool_and_no_invariance(runner: Harness,
                                                           tiny_model: Path) -> None:
    loaded = runner.loaded(tiny_model, n_ctx=512, parallel=2, kv_unified=True)
    assert loaded["parallel"] == 2 and loaded["kv_unified"] is True
    assert loaded["n_ctx"] == 512  # the whole pool: any one sequence may fill it
    assert loaded["greedy_batch_invariant"] is False  # its attention spans the others' cells
    separate = runner.loaded(tiny_model, n_ctx=256, parallel=2)
    assert separate["n_ctx"] == 256 and "kv_unified" not in separate
    assert separate["greedy_batch_invariant"] is True


def test_a_prompt_over_a_share_is_served_beside_a_short_request(runner: Harness,
                                                                tiny_model: Path) -> None:
    # the separate layout of the same 512 cells refuses it: 256 per sequence
    runner.loaded(tiny_model, n_ctx=256, parallel=2)
    _, refused = runner.generate("sep", **_opts(LONG, max_tokens=10))
    assert refused["type"] == "error" and refused["code"] == "context_exceeded", refused
    runner.loaded(tiny_model, n_ctx=512, parallel=2, kv_unified=True)
    runner.send(rp.generate("short", **_opts(SHORT, max_tokens=120)))
    runner.send(rp.generate("long", **_opts(LONG, max_tokens=30)))
    got = _replies(runner, ["short", "long"])
    long_done = got["long"][1]
    assert long_done["type"] == "done", long_done
    assert long_done["usage"]["prompt_tokens"] > 256
    assert long_done["usage"]["completion_tokens"] == 30
    short_done = got["short"][1]
    assert short_done["usage"]["completion_tokens"] == 120
    assert short_done["timings"]["batched_max"] == 2  # they decoded together


def test_a_full_pool_ends_the_largest_request_and_the_runner_goes_on(runner: Harness,
                                                                    tiny_model: Path) -> None:
    runner.loaded(tiny_model, n_ctx=512, parallel=2, kv_unified=True)
    runner.send(rp.generate("long", **_opts(LONG, max_tokens=400)))
    runner.send(rp.generate("short", **_opts(SHORT, max_tokens=150)))
    got = _replies(runner, ["long", "short"])
    _, long_done, _ = got["long"]
    _, short_done, _ = got["short"]
    assert long_done["type"] == "done", long_done
    assert long_done["finish_reason"] == "length", long_done
    assert long_done["length_reason"] == "context_window", long_done
    held = long_done["usage"]["prompt_tokens"] + long_done["usage"]["completion_tokens"]
    assert held < 512 - 20  # stopped by the pool, not by a sequence's own limit
    # the other request was not touched: its whole reply
    assert short_done["type"] == "done" and short_done["length_reason"] == "max_tokens"
    assert short_done["usage"]["completion_tokens"] == 150
    text, after = runner.generate("after", **_opts(SHORT, max_tokens=20))
    assert after["type"] == "done" and after["usage"]["completion_tokens"] == 20 and text


def test_idle_cached_cells_are_freed_to_make_room(runner: Harness, tiny_model: Path) -> None:
    runner.loaded(tiny_model, n_ctx=512, parallel=2, kv_unified=True)
    solo, _ = runner.generate("solo", **_opts(LONG, max_tokens=5))
    runner.send(rp.generate("short", **_opts(SHORT, max_tokens=260)))  # sequence 0
    runner.send(rp.generate("long", **_opts(LONG, max_tokens=5)))  # sequence 1, done soon
    got = _replies(runner, ["short", "long"])
    # the long prompt's ~295 cells stay cached in sequence 1 after it ends; the short reply
    # needs 280 more than its 20: they do not both fit in 512 unless the idle ones go
    short_done: dict[str, Any] = got["short"][1]
    assert short_done["type"] == "done", short_done
    assert short_done["length_reason"] == "max_tokens", short_done
    assert short_done["usage"]["completion_tokens"] == 260
    assert got["long"][1]["usage"]["completion_tokens"] == 5
    again, done = runner.generate("again", **_opts(LONG, max_tokens=5))
    assert done["type"] == "done" and again == solo


def test_a_full_pool_pauses_a_reply_that_may_grow(runner: Harness, tiny_model: Path) -> None:
    """With ``grow`` (the daemon has a larger context for it) the request the full pool stops
    is paused with its tokens, for the daemon to continue it after a reload (runner/resume.py)."""
    runner.loaded(tiny_model, n_ctx=512, parallel=2, kv_unified=True)
    runner.send(rp.generate("long", **_opts(LONG, max_tokens=400, grow=True)))
    runner.send(rp.generate("short", **_opts(SHORT, max_tokens=150)))
    got = _replies(runner, ["long", "short"])
    long_done, short_done = got["long"][1], got["short"][1]
    assert long_done["finish_reason"] == "length", long_done
    assert long_done["length_reason"] == "context_window"
    written = long_done["resume"]
    assert len(written) == long_done["usage"]["completion_tokens"] > 0
    assert long_done["usage"]["prompt_tokens"] + len(written) < 512 - 20  # the pool, not its end
    assert short_done["usage"]["completion_tokens"] == 150

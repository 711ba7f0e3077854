"""The daemon process: start-up, lock file, stale socket, signals, and basic requests.

Real daemon process, real runner processes, real llama-cpp-python, tiny generated models.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from daemonutil import alive as _alive
from modeld.client import Client
from modeld.errors import DaemonUnavailableError, ModelNotFoundError, ShuttingDownError

pytestmark = pytest.mark.slow

Factory = Callable[..., Any]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


def _wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        if not pids:
            return []
        time.sleep(0.05)
    return pids


def test_client_reports_missing_daemon(tmp_path: Path) -> None:
    with pytest.raises(DaemonUnavailableError) as info:
        Client(f"ipc://{tmp_path / 'none.sock'}").ping()
    assert "daemon not running" in info.value.message
    assert "modeld serve" in info.value.hint
    # a socket file with nobody behind it (a crashed daemon) is also reported quickly
    (tmp_path / "dead.sock").touch()
    with pytest.raises(DaemonUnavailableError):
        Client(f"ipc://{tmp_path / 'dead.sock'}", connect_timeout=0.3).ping()


def test_ping_ps_stats_and_clean_sigterm(daemon_factory: Factory, tiny_model: Path) -> None:
    d = daemon_factory()
    c = d.client()
    pong = c.ping()
    assert pong["pid"] == d.proc.pid and pong["protocol"] == 1
    assert c.ps() == []
    stats = c.stats()
    assert stats["uptime_s"] >= 0 and stats["requests"] == 0 and stats["budget_bytes"] > 0
    assert (d.root / "run").stat().st_mode & 0o777 == 0o700
    assert (d.log_dir / "modeld.log").read_text().count("serving") == 1

    text = c.generate(str(tiny_model), "hello", max_tokens=4, temperature=0).text()
    assert text
    runners = _children(d.proc.pid)
    assert len(runners) >= 1  # the model's runner (+ the spare)
    assert d.stop(signal.SIGTERM) == 0
    assert not d.socket_path.exists()
    assert not d.socket_path.with_name("modeld.sock.lock").exists()
    assert not list((d.root / "run").glob("runners-*.sock"))
    assert _wait_gone(runners) == []


def test_second_daemon_refused_then_stale_socket_cleaned(daemon_factory: Factory) -> None:
    first = daemon_factory()
    second = daemon_factory(root=first.root, wait=False)
    assert second.proc.wait(30) == 1
    assert "already serving" in (first.log_dir / "daemon.stderr").read_text()
    first.client().ping()  # the first one is unharmed

    first.stop(signal.SIGKILL)  # a crash leaves the socket file behind
    assert first.socket_path.exists()
    third = daemon_factory(root=first.root)
    assert third.client().ping()["pid"] == third.proc.pid


def test_generate_is_deterministic_and_reports_timings(
    daemon_factory: Factory, tiny_model: Path
) -> None:
    d = daemon_factory()
    c = d.client()
    first = c.generate(str(tiny_model), "the quick brown fox", max_tokens=12, temperature=0)
    text1 = first.text()
    assert first.done is not None
    t = first.done["timings"]
    for name in ("load_s", "prompt_eval_s", "generation_s", "tokens_per_s", "prompt_tokens",
                 "prompt_tokens_reused", "completion_tokens"):  # fmt: skip
        assert name in t, name
    assert t["completion_tokens"] == 12 and t["load_s"] > 0
    assert first.done["finish_reason"] == "length"
    second = c.generate(str(tiny_model), "the quick brown fox", max_tokens=12, temperature=0)
    assert second.text() == text1
    assert second.done is not None and second.done["timings"]["load_s"] == 0
    stats = c.stats()
    assert (stats["hits"], stats["misses"], stats["loads"]) == (1, 1, 1)
    assert stats["tokens_generated"] == 24


def test_chat_and_unknown_model(daemon_factory: Factory, tiny_chat_model: Path) -> None:
    d = daemon_factory()
    c = d.client()
    gen = c.chat(str(tiny_chat_model), [{"role": "user", "content": "hi"}], max_tokens=5)
    assert isinstance(gen.text(), str)
    assert gen.done is not None and gen.done["timings"]["completion_tokens"] >= 1
    # a field of the request (requestfields.Asked) passed as a keyword reaches the runner
    counted = c.chat(str(tiny_chat_model), [{"role": "user", "content": "hi"}], count_only=True)
    assert counted.text() == "" and counted.done is not None
    assert counted.done["usage"]["prompt_tokens"] == gen.done["usage"]["prompt_tokens"] > 0
    assert counted.done["usage"]["completion_tokens"] == 0
    with pytest.raises(ModelNotFoundError):
        c.generate(str(tiny_chat_model.with_name("nope.gguf")), "x").text()
    with pytest.raises(ModelNotFoundError):
        c.load("no-such-model-name")


def test_embed_mode_is_a_separate_entry(daemon_factory: Factory, model_factory: Factory) -> None:
    model = model_factory("llama", **ggufgen.TINY)
    d = daemon_factory()
    c = d.client()
    reply = c.embed(str(model), ["one", "two words"])
    vectors = reply["embeddings"]
    assert len(vectors) == 2
    assert all(len(v) == ggufgen.TINY["n_embd"] for v in vectors)
    assert vectors[0] != vectors[1]
    assert c.embed(str(model), "one")["embeddings"][0] == pytest.approx(vectors[0], abs=1e-5)
    c.generate(str(model), "one", max_tokens=2).text()
    modes = sorted(row["mode"] for row in c.ps())
    assert modes == ["embed", "generate"]


@pytest.mark.parametrize("how", ["request", "SIGINT", "SIGTERM"])
def test_stopping_fails_in_flight_requests_and_cleans_up(
    daemon_factory: Factory, model_factory: Factory, how: str
) -> None:
    model = model_factory("llama", **dict(ggufgen.TINY, context_length=32768))
    d = daemon_factory()
    streamer = d.client()
    gen = streamer.generate(str(model), "a", max_tokens=30000, n_ctx=32768, temperature=0)
    it = iter(gen)
    assert next(it)  # generating now
    runners = _children(d.proc.pid)
    if how == "request":
        assert d.client().shutdown() == {"stopping": True}
    else:
        d.proc.send_signal(getattr(signal, how))
    with pytest.raises(ShuttingDownError) as info:
        for _ in it:
            pass
    assert "shutting down" in info.value.message
    assert d.proc.wait(20) == 0
    assert not d.socket_path.exists()
    assert not d.socket_path.with_name("modeld.sock.lock").exists()
    assert _wait_gone(runners) == []

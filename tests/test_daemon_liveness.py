"""Runner liveness: a runner that stops answering is killed and its callers told, while one that
is busy inside llama.cpp (a long prompt evaluation) keeps its heartbeat and is left alone.

Real daemon, real runners, real signals: SIGSTOP freezes every thread of a runner, which is
what a wedged process looks like from outside (before this, a client waited forever).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from daemonutil import rows, until
from modeld.client import Client
from modeld.errors import RunnerCrashedError
from modeld.model import memory

Factory = Callable[..., Any]
STALL_S = "2"
LONG = dict(ggufgen.TINY, context_length=32768)


@pytest.fixture(scope="module")
def long_model(model_factory: Factory) -> Path:
    return model_factory("llama", **LONG)


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status


def _runner_pids(daemon_pid: int) -> list[int]:
    """The daemon's runner processes (its children running ``modeld.runner``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == daemon_pid and b"modeld.runner" in cmd:
            out.append(int(entry.name))
    return out


def test_stopped_runner_ends_its_request_and_the_model_comes_back(
    daemon_factory: Factory, long_model: Path, tiny_model: Path
) -> None:
    d = daemon_factory("--runner-stall", STALL_S)
    c = d.client()
    c.load(str(long_model), n_ctx=8192)
    c.load(str(tiny_model))
    victim = int(rows(c)[long_model.name]["runner_pid"])
    other = int(rows(c)[tiny_model.name]["runner_pid"])

    streamer = Client(d.endpoint, timeout=60.0, connect_timeout=10.0)
    stream = iter(streamer.generate(str(long_model), "a", max_tokens=8000, temperature=0))
    assert next(stream)
    os.kill(victim, signal.SIGSTOP)
    try:
        with pytest.raises(RunnerCrashedError) as info:
            for _ in stream:
                pass
    finally:
        streamer.close()
    assert "stopped answering" in info.value.message
    assert "runner_stall_s" in info.value.hint
    until(lambda: _gone(victim), timeout=20, what="the stopped runner to be killed")

    stats = c.stats()
    assert stats["runner_stalls"] == 1 and stats["evictions"]["crash"] == 1
    assert c.generate(str(tiny_model), "other", max_tokens=3).text() is not None
    assert int(rows(c)[tiny_model.name]["runner_pid"]) == other  # unaffected
    assert c.generate(str(long_model), "again", max_tokens=3).text() is not None
    assert int(rows(c)[long_model.name]["runner_pid"]) != victim
    assert d.proc.poll() is None


def test_long_prompt_evaluation_is_not_a_stall(
    daemon_factory: Factory, default_model: Path
) -> None:
    """Several seconds inside one request (no chunk sent yet) with a 2 s stall limit: the
    heartbeat thread speaks for the runner while llama.cpp evaluates."""
    d = daemon_factory("--runner-stall", STALL_S, "--prompt-cache-mib", "0")
    c = d.client(timeout=300.0)
    prompt = " ".join(f"item {i}," for i in range(800))  # ~2k tokens: seconds on 2 cores
    gen = c.generate(str(default_model), prompt, raw=True, max_tokens=1, temperature=0,
                     n_ctx=8192)
    gen.text()
    assert gen.done is not None
    # The check means something only if evaluation outlasted the stall limit.
    assert gen.done["timings"]["prompt_eval_s"] > float(STALL_S), gen.done["timings"]
    assert c.stats()["runner_stalls"] == 0


def test_a_stopped_spare_does_not_block_loads(daemon_factory: Factory, tiny_model: Path) -> None:
    d = daemon_factory("--runner-stall", "30")
    c = d.client()
    until(lambda: c.stats()["spare_runner"] and len(_runner_pids(d.proc.pid)) == 1,
          timeout=30, what="the spare runner")
    # Measured by the spare's hello (until then the built-in guess): the spare is ready.
    until(lambda: c.stats()["runner_baseline_bytes"] != memory.RUNNER_BASELINE, timeout=30,
          what="the spare's hello")
    (spare,) = _runner_pids(d.proc.pid)
    os.kill(spare, signal.SIGSTOP)
    try:
        time.sleep(3.5)  # more than three heartbeat periods without a word
        started = time.monotonic()
        c.load(str(tiny_model))
        assert time.monotonic() - started < 25  # not the 30 s stall limit: another runner
        assert int(rows(c)[tiny_model.name]["runner_pid"]) != spare
        assert c.generate(str(tiny_model), "hello", max_tokens=2).text() is not None
    finally:
        if not _gone(spare):
            os.kill(spare, signal.SIGCONT)
    until(lambda: _gone(spare), timeout=30, what="the stopped spare to be retired")

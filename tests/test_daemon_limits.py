"""The daemon's limits, each against a real daemon with real runners and generated models:
the first load's runner baseline, ``max_queue``, ``queue_timeout_s`` and ``load_timeout_s``.

Why: these paths only run when something is slow or full, so ordinary traffic never exercises
them; each test checks the limit's error *and* that the daemon keeps serving afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from daemonutil import rows, until
from modeld import sizing
from modeld.config import Settings
from modeld.errors import ErrorCode, RequestTimeoutError
from modeld.model import memory

pytestmark = pytest.mark.slow

Factory = Callable[..., Any]
LONG = dict(ggufgen.TINY, n_embd=256, n_ff=512, context_length=32768)
#: llama.cpp builds the vocabulary when it loads a model: 600k tokens take over a second on 2
#: cores (the tiny model loads in milliseconds), a real load that outlasts a short timeout.
SLOW_LOAD = dict(ggufgen.TINY, n_vocab=600_000)


@pytest.fixture(scope="module")
def long_model(model_factory: Factory) -> Path:
    return model_factory("llama", **LONG)


@pytest.fixture(scope="module")
def slow_load_model(model_factory: Factory) -> Path:
    return model_factory("llama", **SLOW_LOAD)


def test_first_load_is_sized_with_the_measured_runner_baseline(
    daemon_factory: Factory, tiny_model: Path
) -> None:
    # runners as new processes: a forked spare says hello before a load can arrive
    d = daemon_factory("--no-runner-fork", wait=False, env={"MODELD_PARALLEL": "1"})
    until(d.socket_path.exists, what="the daemon's socket")
    c = d.client()
    row = c.load(str(tiny_model))  # sent while the spare runner is still importing llama_cpp
    baseline = c.stats()["runner_baseline_bytes"]
    assert baseline != memory.RUNNER_BASELINE  # the spare's measurement, not the default
    info = sizing.read_info(row["path"])
    estimate = memory.estimate(info, row["n_ctx"], mode="generate").total
    # the reservation used the measurement (plus the runner's prompt cache, default size)
    settings = Settings(prompt_cache_mib=int(d.env["MODELD_PROMPT_CACHE_MIB"]))
    cache = sizing.prompt_cache_bytes("generate", settings, c.stats()["budget_bytes"])
    assert row["estimate_bytes"] == estimate + baseline + cache
    log = d.log_text()
    assert "waits for runner" in log, f"the load did not arrive before the spare's hello:\n{log}"
    assert c.generate(str(tiny_model), "hi", max_tokens=2).text() is not None


def test_max_queue_refuses_at_once_and_keeps_serving(
    daemon_factory: Factory, long_model: Path, tiny_model: Path
) -> None:
    d = daemon_factory(env={"MODELD_MAX_QUEUE": "1"})
    watcher = d.client()
    # one sequence at a time, so the second request queues (greedy ones share decode steps)
    watcher.load(str(long_model), n_ctx=8192, parallel=1)
    busy = d.client().generate(str(long_model), "a", max_tokens=8000, temperature=0)
    stream = iter(busy)
    assert next(stream)
    queued = d.client().generate(str(long_model), "b", max_tokens=3)
    until(lambda: rows(watcher)[long_model.name]["queued"] == 1, what="one queued request")

    with pytest.raises(RequestTimeoutError) as info:
        d.client().generate(str(tiny_model), "c", max_tokens=2).text()
    assert info.value.code is ErrorCode.TIMEOUT
    assert "already queued" in info.value.message
    assert "max_queue" in info.value.hint
    # refused while the queue was still full: nothing had to finish first
    row = rows(watcher)[long_model.name]
    assert (row["in_flight"], row["queued"]) == (1, 1)
    assert tiny_model.name not in rows(watcher)

    busy.close()  # cancel: the queued request runs next and completes
    assert queued.text() is not None
    assert queued.done is not None and queued.done["finish_reason"] == "length"
    assert watcher.generate(str(tiny_model), "d", max_tokens=2).text() is not None
    assert watcher.stats()["waiting"] == 0


def test_queue_timeout_fails_the_waiter_not_the_busy_model(
    daemon_factory: Factory, long_model: Path, tiny_model: Path
) -> None:
    d = daemon_factory("--max-models", "1", "--queue-timeout", "0.5")
    watcher = d.client()
    watcher.load(str(long_model), n_ctx=8192)
    # ~8000 tokens take seconds (attention grows with the context): longer than the timeout
    busy = d.client().generate(str(long_model), "a", max_tokens=8000, temperature=0)
    stream = iter(busy)
    assert next(stream)

    with pytest.raises(RequestTimeoutError) as info:
        d.client().generate(str(tiny_model), "x", max_tokens=2).text()
    assert info.value.code is ErrorCode.TIMEOUT
    assert "waited 0.5 s for room" in info.value.message
    assert info.value.hint
    assert rows(watcher)[long_model.name]["in_flight"] == 1, "the busy generation ended first"

    "".join(stream)  # the busy generation is not disturbed by the waiter's timeout
    assert busy.done is not None
    assert busy.done["finish_reason"] == "length"
    assert busy.done["timings"]["completion_tokens"] == 8000
    assert watcher.stats()["waiting"] == 0
    assert watcher.generate(str(tiny_model), "y", max_tokens=2).text() is not None


def test_load_timeout_fails_the_load_and_stops_its_runner(
    daemon_factory: Factory, slow_load_model: Path, tiny_model: Path
) -> None:
    d = daemon_factory("--load-timeout", "0.5")
    watcher = d.client()
    gen = d.client().generate(str(slow_load_model), "x", max_tokens=2)
    name = slow_load_model.name

    def loading_pid() -> int | None:
        row = rows(watcher).get(name)
        return row["runner_pid"] if row and row["state"] == "loading" else None

    pid = until(loading_pid, what="the slow model loading in a runner", show=watcher.ps)
    with pytest.raises(RequestTimeoutError) as info:
        gen.text()
    assert info.value.code is ErrorCode.TIMEOUT
    assert "took longer than 0.5 s" in info.value.message
    assert "load_timeout_s" in info.value.hint
    # its runner is still reading the model: that memory stays charged until the runner exits
    assert Path(f"/proc/{pid}").exists()
    assert watcher.stats()["used_bytes"] > 0

    until(lambda: not Path(f"/proc/{pid}").exists(), what="the timed-out runner to exit")
    assert name not in rows(watcher)
    stats = watcher.stats()
    assert stats["load_failures"] == 1
    assert stats["used_bytes"] == 0
    # the daemon goes on: a model that loads in time works, the slow one cools down
    assert watcher.generate(str(tiny_model), "next", max_tokens=2).text() is not None
    with pytest.raises(RequestTimeoutError):
        watcher.generate(str(slow_load_model), "again", max_tokens=2).text()
    assert watcher.stats()["load_failures"] == 1  # answered from the failure record

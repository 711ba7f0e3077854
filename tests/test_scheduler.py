"""The scheduler on its own: a fake supervisor records what it is asked to do, a fake clock.

Why: the daemon tests drive the scheduler through real runner processes, which shows that the
whole works but not which decision made it work, and cannot move time. Here every runner
message is played by the test and the supervisor only records spawns, messages and stops, so
each rule (admission, waiting, eviction, reuse of a runner, keep-alive, timeouts, cancels,
crashes) is checked as a decision. The models are real generated GGUF files (the scheduler
reads their headers and sizes them with the real estimate) and the cache policy is the real
one; only the processes and the clock are fakes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from modeld.cache.policy import CachePolicy, EntryState, ModelKey
from modeld.config import Settings
from modeld.daemon.jobs import Job, request_job
from modeld.daemon.scheduler import Scheduler
from modeld.daemon.supervisor import RunnerHandle, Supervisor
from modeld.wire import protocol, reqparse
from modeld.wire.options import Sampling

MiB = 1 << 20
CLIENT = b"client-1"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeProcess:
    """What the supervisor reads of a runner's process: its pid and whether it exited."""

    pid: int
    code: int | None = None

    def poll(self) -> int | None:
        return self.code


class FakeSupervisor(Supervisor):
    """A supervisor that starts no process and binds no socket: it records what the scheduler
    asks of it (spawns, messages, stops) and reports the exits the test makes happen."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self.forks = None  # runners as processes (the pool's spare and reuse rules)
        self.runners: dict[str, RunnerHandle] = {}
        self.stalls = 0
        self.spawned: list[str] = []
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.stopped: list[str] = []

    def spawn(self, fork: bool = True) -> RunnerHandle:
        rid = f"r{len(self.spawned) + 1}"
        now = self._clock()
        runner = RunnerHandle(rid, FakeProcess(4000 + len(self.spawned)), now, last_heard=now)  # type: ignore[arg-type]
        self.runners[rid] = runner
        self.spawned.append(rid)
        return runner

    def send(self, runner_id: str, msg: dict[str, Any]) -> bool:
        if runner_id not in self.runners:
            return False
        self.sent.append((runner_id, msg))
        return True

    def stop(self, runner_id: str) -> None:
        runner = self.runners.get(runner_id)
        if runner is not None and runner.stopping_since is None:
            runner.stopping_since = self._clock()
            self.stopped.append(runner_id)

    def reap(self) -> list[RunnerHandle]:
        gone = [r for r in self.runners.values() if r.popen.poll() is not None]
        for runner in gone:
            runner.exit_code = runner.popen.poll()
            del self.runners[runner.id]
        return gone

    def kill_stalled(self, stall_s: float) -> list[RunnerHandle]:
        return []

    # ---- for the test

    def messages(self, runner_id: str, mtype: str) -> list[dict[str, Any]]:
        return [m for r, m in self.sent if r == runner_id and m["type"] == mtype]


@dataclass
class Harness:
    sched: Scheduler
    sup: FakeSupervisor
    clock: FakeClock
    cache: CachePolicy
    replies: list[tuple[Job, protocol.Message]] = field(default_factory=list)

    def submit(
        self, path: Path, rid: str, *, max_tokens: int = 8, client: bytes = CLIENT, **opts: Any
    ) -> Job:
        sampling = Sampling(max_tokens=max_tokens, **opts)
        req = reqparse.GenerateRequest(model=str(path), prompt="hi",
                                       options=reqparse.GenerateOptions(sampling))
        job = request_job(client, rid, req, ModelKey.for_file(str(path), "generate"),
                          path.stem, self.sched.settings)  # fmt: skip
        self.sched.submit(job)
        return job

    def serve_one(self, path: Path) -> Job:
        """Load ``path`` in a new runner r1 and finish one request on it: the model is idle."""
        job = self.submit(path, "a")
        self.hello("r1")
        self.loaded("r1")
        self.done("r1", job.runner_rid)
        return job

    def running_and_queued(self, path: Path) -> tuple[Job, Job]:
        """Two requests on one sequence (``parallel`` 1): "a" runs in r1, "b" waits behind."""
        running, queued = self.submit(path, "a"), self.submit(path, "b")
        self.hello("r1")
        self.loaded("r1")
        return running, queued

    def hello(self, runner_id: str) -> None:
        runner = self.sup.runners[runner_id]
        runner.ready, runner.baseline = True, {"rss": 40 * MiB, "anon": 30 * MiB, "file": 10 * MiB}
        self.sched.on_runner_message(runner, {"type": "hello", "pid": runner.pid})

    def loaded(self, runner_id: str, rss: int = 60 * MiB) -> None:
        load = self.sup.messages(runner_id, "load")[-1]
        msg = {"type": "loaded", "n_ctx": load["n_ctx"], "parallel": load.get("parallel", 1),
               "memory": {"rss": rss, "anon": rss // 2, "file": rss // 2}}  # fmt: skip
        self.sched.on_runner_message(self.sup.runners[runner_id], msg)

    def runner_says(self, runner_id: str, msg: dict[str, Any]) -> None:
        self.sched.on_runner_message(self.sup.runners[runner_id], msg)

    def done(self, runner_id: str, runner_rid: str, tokens: int = 8) -> None:
        self.runner_says(runner_id, {
            "type": "done", "rid": runner_rid, "finish_reason": "length",
            "usage": {"prompt_tokens": 2, "prompt_tokens_reused": 0, "completion_tokens": tokens},
            "timings": {"prompt_eval_s": 0.01, "generation_s": 0.1, "tokens_per_s": 80.0},
            "memory": {"rss": 62 * MiB, "anon": 31 * MiB, "file": 31 * MiB},
        })  # fmt: skip

    def reply_to(self, job: Job) -> protocol.Message:
        found = [m for j, m in self.replies if j is job and m.type in ("done", "error")]
        assert len(found) == 1, found
        return found[0]


def make(budget: int = 2048 * MiB, **settings: Any) -> Harness:
    clock = FakeClock()
    config = Settings(**{"spare_runner": False, "prompt_cache_mib": 0, **settings})
    cache = CachePolicy(budget, config.max_models, clock, default_keep_alive_s=config.keep_alive_s)
    sup = FakeSupervisor(clock)
    replies: list[tuple[Job, protocol.Message]] = []

    def send(job: Job, msg: protocol.Message) -> bool:
        replies.append((job, msg))
        return True

    sched = Scheduler(config, cache, sup, send, clock)
    return Harness(sched, sup, clock, cache, replies)


@pytest.fixture(scope="module")
def second_model(model_factory: Any) -> Path:
    return Path(model_factory("llama", **dict(ggufgen.TINY, seed=7)))


def test_a_cold_request_loads_then_runs_and_its_reply_is_timed_by_the_clock(
    tiny_model: Path,
) -> None:
    h = make()
    job = h.submit(tiny_model, "a")
    assert h.sup.spawned == ["r1"]
    (load,) = h.sup.messages("r1", "load")
    assert load["path"] == str(tiny_model) and load["mode"] == "generate"
    assert load["warm_up"] is False  # the waiting request is the warm-up
    assert not h.sup.messages("r1", "generate")  # not before the model is loaded
    h.hello("r1")
    h.clock.advance(0.5)
    h.loaded("r1")
    (gen,) = h.sup.messages("r1", "generate")
    assert gen["prompt"] == "hi" and gen["max_tokens"] == 8 and gen["rid"] == job.runner_rid
    assert h.cache.get(job.key).state is EntryState.READY  # type: ignore[union-attr]
    h.runner_says("r1", {"type": "chunk", "rid": job.runner_rid, "text": "hel"})
    h.clock.advance(2.0)
    h.done("r1", job.runner_rid)
    chunks = [m for j, m in h.replies if m.type == "chunk"]
    assert [m.body["text"] for m in chunks] == ["hel"]
    done = h.reply_to(job)
    assert done.type == "done" and done.body["finish_reason"] == "length"
    assert done.body["timings"]["load_s"] == pytest.approx(0.5)  # the load it waited for
    assert done.body["timings"]["total_s"] == pytest.approx(2.5)  # the injected clock
    assert h.sched.jobs == {}


def test_keep_alive_counts_from_the_end_of_the_request(tiny_model: Path) -> None:
    h = make(keep_alive="30s")
    job = h.submit(tiny_model, "a")
    h.hello("r1")
    h.loaded("r1")
    h.clock.advance(100.0)  # a long generation: the keep-alive clock has not started
    h.sched.tick()
    assert not h.sup.stopped
    h.done("r1", job.runner_rid)
    h.clock.advance(29.0)
    h.sched.tick()
    assert not h.sup.stopped and h.sched.slots
    h.clock.advance(2.0)
    h.sched.tick()
    assert h.sup.stopped == ["r1"] and not h.sched.slots


def test_an_evicted_models_runner_becomes_the_spare_and_serves_the_next_load(
    tiny_model: Path,
) -> None:
    h = make(spare_runner=True)
    job = h.serve_one(tiny_model)
    assert h.sched.unload([job.key]) == ([tiny_model.stem], [])
    assert h.sup.messages("r1", "unload")  # asked to close its model, not to exit
    assert "r1" not in h.sup.stopped
    h.runner_says("r1", {"type": "unloaded", "memory": {"rss": 45 * MiB},
                         "footprint": {"rss": 5 * MiB}})  # fmt: skip
    assert h.sched.spare == "r1"
    again = h.submit(tiny_model, "b")
    assert h.sup.spawned == ["r1"]  # no new process
    assert len(h.sup.messages("r1", "load")) == 2
    h.loaded("r1")
    assert h.sup.messages("r1", "generate")[-1]["rid"] == again.runner_rid


def test_a_runner_that_keeps_memory_after_unloading_is_stopped(tiny_model: Path) -> None:
    h = make(spare_runner=True)
    job = h.serve_one(tiny_model)
    h.sched.unload([job.key])
    h.runner_says("r1", {"type": "unloaded", "memory": {"rss": 140 * MiB},
                         "footprint": {"rss": 100 * MiB}})  # fmt: skip
    assert h.sup.stopped == ["r1"] and h.sched.spare is None


def test_a_runner_that_asks_not_to_be_reused_is_stopped(tiny_model: Path) -> None:
    """A runner that turned ggml-cpu's tiled matmul off for its process (parallel 8+:
    runner/llamaopen.py) gave its memory back but says it should not load another model."""
    h = make(spare_runner=True)
    job = h.serve_one(tiny_model)
    h.sched.unload([job.key])
    h.runner_says("r1", {"type": "unloaded", "memory": {"rss": 45 * MiB},
                         "footprint": {"rss": 5 * MiB}, "reusable": False})  # fmt: skip
    assert h.sup.stopped == ["r1"] and h.sched.spare is None


def test_a_client_that_moves_on_to_another_model_swaps_at_once(
    tiny_model: Path, second_model: Path
) -> None:
    h = make(max_models=1)
    h.serve_one(tiny_model)
    h.submit(second_model, "b")  # the same client: no follow-up for the first is coming
    assert h.sup.stopped == ["r1"]  # evicted (no spare wanted: stopped, not recycled)
    assert h.sup.spawned == ["r1", "r2"]
    assert h.sup.messages("r2", "load")[0]["path"] == str(second_model)


def test_another_clients_just_used_model_gets_the_swap_grace(
    tiny_model: Path, second_model: Path
) -> None:
    h = make(max_models=1)
    h.serve_one(tiny_model)
    h.submit(second_model, "b", client=b"client-2")
    assert not h.sup.stopped and h.sup.spawned == ["r1"]  # its client may send a follow-up
    assert "giving just-used models a moment" in h.sched.waiting[next(iter(h.sched.waiting))].reason
    h.clock.advance(0.3)
    h.sched.tick()
    assert h.sup.stopped == ["r1"] and h.sup.spawned == ["r1", "r2"]


def test_a_busy_model_is_never_evicted_and_the_waiter_times_out(
    tiny_model: Path, second_model: Path
) -> None:
    h = make(max_models=1, queue_timeout_s=10.0)
    busy = h.submit(tiny_model, "a", max_tokens=1000)
    h.hello("r1")
    h.loaded("r1")
    waiter = h.submit(second_model, "b")
    assert h.sched.waiting and not h.sup.stopped
    h.clock.advance(9.0)
    h.sched.tick()
    assert not [m for j, m in h.replies if j is waiter]
    h.clock.advance(2.0)
    h.sched.tick()
    err = h.reply_to(waiter)
    assert err.type == "error" and err.body["code"] == "timeout"
    assert "waited 10 s for room" in err.body["message"]
    assert not h.sup.stopped and busy.runner_rid in h.sched.slots[busy.key].active
    h.done("r1", busy.runner_rid, tokens=1000)
    assert h.reply_to(busy).type == "done"


def test_cancel_reaches_the_runner_or_the_queue(tiny_model: Path) -> None:
    h = make(parallel=1)
    running, queued = h.running_and_queued(tiny_model)
    assert [m["rid"] for m in h.sup.messages("r1", "generate")] == [running.runner_rid]
    assert h.sched.cancel(CLIENT, "b")  # queued: ends at once, never sent
    assert h.reply_to(queued).body["code"] == "cancelled"
    assert h.sched.cancel(CLIENT, "a")  # running: the runner is told and ends it
    assert h.sup.messages("r1", "cancel") == [{"type": "cancel", "rid": running.runner_rid}]
    assert not [m for j, m in h.replies if j is running]
    h.runner_says("r1", {"type": "error", "rid": running.runner_rid, "code": "cancelled",
                         "message": "generation stopped: cancelled"})  # fmt: skip
    assert h.reply_to(running).body["code"] == "cancelled"
    assert not h.sched.cancel(CLIENT, "a")  # gone


def test_a_crashed_runner_fails_its_requests_and_the_queue_loads_again(tiny_model: Path) -> None:
    h = make(parallel=1)
    running, queued = h.running_and_queued(tiny_model)
    h.sup.runners["r1"].popen.code = -9  # type: ignore[attr-defined]
    h.sched.tick()
    err = h.reply_to(running)
    assert err.body["code"] == "runner_crashed" and "exited with code -9" in err.body["message"]
    assert h.sup.spawned == ["r1", "r2"]  # the queued request loads the model again
    h.hello("r2")
    h.loaded("r2")
    assert h.sup.messages("r2", "generate")[0]["rid"] == queued.runner_rid


def test_a_load_that_outlasts_load_timeout_fails_and_stops_its_runner(tiny_model: Path) -> None:
    h = make(load_timeout_s=30.0)
    job = h.submit(tiny_model, "a")
    h.hello("r1")
    h.clock.advance(31.0)
    h.sched.tick()
    assert "r1" in h.sup.stopped
    err = h.reply_to(job)
    assert err.body["code"] == "timeout" and "longer than 30 s" in err.body["message"]


def test_a_full_queue_refuses_at_once(tiny_model: Path) -> None:
    h = make(max_queue=2)
    a, b = h.submit(tiny_model, "a"), h.submit(tiny_model, "b")
    c = h.submit(tiny_model, "c")
    assert h.reply_to(c).body["code"] == "timeout"  # refused, not queued
    assert "2 requests are already queued" in h.reply_to(c).body["message"]
    assert set(h.sched.jobs) == {(CLIENT, "a"), (CLIENT, "b")} and a.key == b.key

"""What an explicit ``load`` set stays set (issue 36): its ``parallel``, context floor and
keep-alive survive a reload for a prompt that outgrew the context, and a request without a
keep-alive of its own does not shorten the load's. Driven as tests/test_scheduler.py drives
the scheduler: real generated GGUF headers, real cache policy, fake processes and clock."""

from __future__ import annotations

from pathlib import Path

import ggufgen
from modeld.cache.policy import EntryState, ModelKey
from modeld.daemon.jobs import Job, request_job
from modeld.errors import ErrorCode
from modeld.wire import reqparse, runnerwire
from test_scheduler import CLIENT, Harness, make

HOUR = 3600.0


def _load(h: Harness, path: Path, rid: str, **kw: object) -> Job:
    job = Job(client=CLIENT, rid=rid, kind="load", key=ModelKey.for_file(str(path), "generate"),
              name=path.stem, **kw)  # type: ignore[arg-type]
    h.sched.submit(job)
    return job


def _submit(h: Harness, path: Path, rid: str, keep_alive: str) -> Job:
    req = reqparse.GenerateRequest(model=str(path), prompt="hi",
                                   options=reqparse.GenerateOptions(keep_alive=keep_alive))
    job = request_job(CLIENT, rid, req, ModelKey.for_file(str(path), "generate"), path.stem,
                      h.sched.settings)
    h.sched.submit(job)
    return job


def _outgrow(h: Harness, runner: str, job: Job, prompt_tokens: int) -> None:
    h.runner_says(runner, runnerwire.error(
        job.runner_rid, ErrorCode.CONTEXT_EXCEEDED, "too long",
        {"prompt_tokens": prompt_tokens, "n_ctx": 512}))


def test_growth_keeps_parallel_floor_and_keep_alive_of_the_load(model_factory: object) -> None:
    # heads of 32 (n_embd 64 / 2 heads): a quantized KV cache needs a multiple of 32
    model = Path(model_factory("llama", **dict(ggufgen.TINY, n_head=2, context_length=32768)))  # type: ignore[operator]
    h = make()
    _load(h, model, "L", keep_alive_s=HOUR, n_ctx=512, parallel=1, kv_cache_type="q8_0")
    h.hello("r1")
    h.loaded("r1")
    key = ModelKey.for_file(str(model), "generate")
    entry = h.cache.get(key)
    assert entry is not None and entry.keep_alive_s == HOUR and entry.n_ctx == 512

    a = h.submit(model, "a", max_tokens=64)  # no keep-alive of its own
    _outgrow(h, "r1", a, 700)
    runner = h.sup.spawned[-1]
    load = h.sup.messages(runner, "load")[-1]
    assert load.get("parallel", 1) == 1  # the load's, not the automatic 4
    assert load["type_k"] == load["type_v"] == "q8_0"  # the load's KV cache type, not f16
    assert load["n_ctx"] >= 768
    entry = h.cache.get(key)
    assert entry is not None and entry.keep_alive_s == HOUR  # not the 5 min default
    if not h.sup.runners[runner].ready:
        h.hello(runner)
    h.loaded(runner)
    h.done(runner, a.runner_rid)
    entry = h.cache.get(key)
    assert entry is not None and entry.keep_alive_s == HOUR
    assert entry.expires_at == h.clock.now + HOUR

    b = _submit(h, model, "b", "10s")  # its own keep-alive is honoured ...
    h.done(runner, b.runner_rid)
    assert h.cache.get(key).keep_alive_s == 10  # type: ignore[union-attr]
    c = h.submit(model, "c")  # ... and the next plain request gets the load's again
    h.done(runner, c.runner_rid)
    assert h.cache.get(key).keep_alive_s == HOUR  # type: ignore[union-attr]

    # a later load without --ctx keeps the floor: a reload for parallel 2 is not smaller
    grown = h.cache.get(key).n_ctx  # type: ignore[union-attr]
    _load(h, model, "L2", parallel=2)
    runner2 = h.sup.spawned[-1]
    load2 = h.sup.messages(runner2, "load")[-1]
    assert load2["parallel"] == 2 and load2["n_ctx"] >= 512
    assert h.sched.dispatch.asked[key].n_ctx == 512 and grown >= 768
    assert h.sched.dispatch.asked[key].keep_alive_s == HOUR


def test_an_unloaded_model_forgets_what_its_load_set(tiny_model: Path) -> None:
    h = make()
    _load(h, tiny_model, "L", keep_alive_s=HOUR, parallel=1)
    h.hello("r1")
    h.loaded("r1")
    key = ModelKey.for_file(str(tiny_model), "generate")
    assert h.sched.dispatch.asked[key].parallel == 1
    h.sched.unload([key])
    assert key not in h.sched.dispatch.asked
    assert h.cache.get(key) is None or h.cache.get(key).state is EntryState.UNLOADING  # type: ignore[union-attr]
    h.submit(tiny_model, "a")
    load = h.sup.messages(h.sup.spawned[-1], "load")[-1]
    assert load["parallel"] == 4  # automatic again

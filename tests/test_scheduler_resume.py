"""The daemon's side of a reply that outgrows its context (issue 36, runner/resume.py): a
runner's ``done`` with ``resume`` queues the request again at the head, with a larger context
when the memory and the training context allow (a reload) and ``grow`` false otherwise (it ends
where it is); the client gets one ``done`` that adds the parts up. Driven as
tests/test_scheduler.py drives the scheduler: real generated GGUF headers, real cache policy,
fake processes and clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ggufgen
from modeld import sizing
from modeld.cache.policy import ModelKey
from modeld.daemon.jobs import Job
from test_scheduler import Harness, make
from test_scheduler_asked import _load


def _stopped(h: Harness, runner: str, job: Job, written: int, prompt: int = 100) -> None:
    """``job``'s runner ran out of cells after ``written`` tokens (the reply goes on)."""
    h.runner_says(runner, {
        "type": "done", "rid": job.runner_rid, "finish_reason": "length",
        "length_reason": "context_window", "resume": list(range(written)),
        "usage": {"prompt_tokens": prompt, "prompt_tokens_reused": 60,
                  "completion_tokens": written},
        "timings": {"prompt_eval_s": 0.5, "generation_s": 2.0, "tokens_per_s": 1.0},
    })  # fmt: skip


def _loaded(model_factory: Any, context_length: int) -> tuple[Harness, Path]:
    """A scheduler with a model of ``context_length`` loaded at n_ctx 512, parallel 1."""
    model = Path(model_factory("llama", **dict(ggufgen.TINY, context_length=context_length)))
    h = make()
    _load(h, model, "L", n_ctx=512, parallel=1)
    h.hello("r1")
    h.loaded("r1")
    return h, model


def test_a_reply_goes_on_in_a_larger_context(model_factory: Any) -> None:
    h, model = _loaded(model_factory, 32768)
    job = h.submit(model, "a", max_tokens=4000)
    (first,) = h.sup.messages("r1", "generate")
    assert first["grow"] is True and "resume" not in first
    _stopped(h, "r1", job, 411)
    assert [m.type for j, m in h.replies if j is job] == []  # no done yet
    runner = h.sup.spawned[-1]
    assert runner != "r1" and h.sup.messages(runner, "load")[-1]["n_ctx"] == 2048
    # doubled until the 511 tokens and room to write (up to 1,024 more) fit
    h.hello(runner)
    h.loaded(runner)
    (again,) = h.sup.messages(runner, "generate")
    assert again["resume"] == list(range(411)) and again["grow"] is True
    assert again["rid"] != first["rid"] and again["max_tokens"] == 4000
    h.runner_says(runner, {
        "type": "done", "rid": job.runner_rid, "finish_reason": "length",
        "length_reason": "max_tokens",
        "usage": {"prompt_tokens": 100, "prompt_tokens_reused": 511, "completion_tokens": 4000},
        "timings": {"prompt_eval_s": 0.25, "generation_s": 5.0, "tokens_per_s": 1.0},
    })  # fmt: skip
    done = h.reply_to(job)
    assert done.type == "done"
    body: dict[str, Any] = dict(done.body)  # type: ignore[attr-defined]
    assert body["usage"] == {"prompt_tokens": 100, "prompt_tokens_reused": 60,
                             "completion_tokens": 4000}  # fmt: skip
    timings = body["timings"]
    assert timings["prompt_eval_s"] == 0.5 and timings["generation_s"] == 2.0 + 0.25 + 5.0
    assert body["length_reason"] == "max_tokens" and body["n_ctx"] == 2048


def test_a_reply_that_cannot_grow_ends_where_it_is(model_factory: Any) -> None:
    h, model = _loaded(model_factory, 32768)
    info = sizing.read_info(str(model))
    at = [sizing.estimate_n(info, n).total for n in (512, 768)]
    h.cache.budget_bytes = h.sched.baseline + (at[0] + at[1]) // 2  # memory got short
    job = h.submit(model, "a", max_tokens=4000)
    _stopped(h, "r1", job, 411)
    assert h.sup.spawned == ["r1"]  # no reload
    *_, again = h.sup.messages("r1", "generate")
    assert again["resume"] == list(range(411)) and again["grow"] is False
    h.done("r1", job.runner_rid, tokens=411)
    assert h.reply_to(job).type == "done"


def test_no_growth_is_offered_at_the_training_context(model_factory: Any) -> None:
    h, model = _loaded(model_factory, 512)
    h.submit(model, "a", max_tokens=4000)
    (gen,) = h.sup.messages("r1", "generate")
    assert gen["grow"] is False
    key = ModelKey.for_file(str(model), "generate")
    assert h.cache.get(key).n_ctx == 512  # type: ignore[union-attr]

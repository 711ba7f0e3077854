"""Several requests on one model: ``parallel``, dispatch, ``ps`` sequences, cancellation.

Real daemon process, real runner processes, real llama-cpp-python, tiny generated models.
The number of sequences decoded together is what the runner reports in ``loaded``; a runner
that decodes one sequence at a time reports none (1), and the daemon then queues the rest:
every assertion here holds for both, as ``parallel`` (the value in effect) is read from ``ps``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from daemonutil import rows, until
from modeld.errors import CancelledError, InvalidRequestError

pytestmark = pytest.mark.slow

Factory = Callable[..., Any]

PROMPTS = ["the quick brown fox", "once upon a time", "1 2 3 4", "hello world", "zz top"]


def _row(client: Any, model: Path) -> dict[str, Any]:
    return rows(client)[model.name]


def test_concurrent_clients_each_get_their_reference(
    daemon_factory: Factory, tiny_model: Path
) -> None:
    d = daemon_factory("--parallel", "3")
    c = d.client()
    refs = {p: c.generate(str(tiny_model), p, max_tokens=24, temperature=0).text() for p in PROMPTS}
    assert len(set(refs.values())) > 1  # different prompts, different replies: a mix-up shows
    row = _row(c, tiny_model)
    assert row["parallel_reason"].startswith("the parallel setting") or "3 planned" in (
        row["parallel_reason"]
    )
    got: dict[tuple[int, int], str] = {}
    errors: list[BaseException] = []

    def client_thread(i: int) -> None:
        try:
            with d.client() as own:
                for j in range(3):
                    prompt = PROMPTS[(i + j) % len(PROMPTS)]
                    got[(i, j)] = own.generate(
                        str(tiny_model), prompt, max_tokens=24, temperature=0
                    ).text()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(got) == 18
    for (i, j), text in got.items():
        assert text == refs[PROMPTS[(i + j) % len(PROMPTS)]], (i, j)
    assert c.stats()["requests"] == len(PROMPTS) + 18


def _long_streams(d: Any, model: Path, n: int, **options: Any) -> Iterator[tuple[Any, Any]]:
    """``n`` (client, stream) pairs whose streams run until cancelled."""
    for i in range(n):
        client = d.client()
        yield client, client.generate(
            str(model), f"{i} a", max_tokens=30000, n_ctx=32768, **options
        )


def test_ps_shows_active_and_queued_and_cancel_leaves_others_running(
    daemon_factory: Factory, model_factory: Factory
) -> None:
    model = model_factory("llama", **dict(ggufgen.TINY, context_length=32768))
    d = daemon_factory("--parallel", "2")
    c = d.client()
    c.load(str(model), n_ctx=32768)
    parallel = _row(c, model)["parallel"]
    assert parallel in (1, 2)
    # Requests sent on different connections reach the daemon in no guaranteed order (each
    # client's I/O thread writes its request when it is scheduled); when the first one sent
    # arrived last it was the queued one, and waiting for its first chunk waited for a
    # 30,000-token stream to end (the flake on a fresh clone, issue 21 item 9). So each is
    # sent once the daemon has counted the one before: the first sent is the first served.
    pairs = []
    for pair in _long_streams(d, model, 3, temperature=0, deterministic=False):
        pairs.append(pair)
        until(lambda: (r := _row(c, model))["in_flight"] + r["queued"] == len(pairs),
              timeout=60, what=f"request {len(pairs)} counted", show=lambda: c.ps())
    gens = [g for _, g in pairs]
    row = until(
        lambda: (r := _row(c, model))["in_flight"] + r["queued"] == 3 and r,
        timeout=60,
        what="three requests on the model",
        show=lambda: c.ps(),
    )
    assert row["in_flight"] == parallel and row["queued"] == 3 - parallel
    assert row["keep_alive_left_s"] is None  # busy: the keep-alive clock has not started
    # the first request is decoding: cancel it, the others go on (or start) and stream
    first = iter(gens[0])
    assert next(first)
    pairs[0][0].cancel(gens[0].request_id)
    with pytest.raises(CancelledError):
        for _ in first:
            pass
    second, third = iter(gens[1]), iter(gens[2])
    assert next(second)  # decoding before and after the cancellation
    if parallel == 1:  # the third waits for the runner: free it
        gens[1].close()
    assert next(third)  # the queued request started
    want = min(2, parallel)
    until(
        lambda: (r := _row(c, model))["in_flight"] == want and r["queued"] == 0,
        what="the queued request decoding",
    )
    for g in gens[1:]:
        g.close()
    until(
        lambda: (r := _row(c, model))["in_flight"] == 0 and r["keep_alive_left_s"] is not None,
        what="the model idle again (its keep-alive counting from the last sequence's end)",
    )
    # the daemon serves on: a new request gets its reply
    assert c.generate(str(model), "b", max_tokens=3, temperature=0).text() is not None


def test_deterministic_greedy_request_is_not_batched(
    daemon_factory: Factory, model_factory: Factory
) -> None:
    """Unless the runner reports that batching keeps greedy tokens equal, a deterministic
    greedy request (the default at temperature 0) has its runner to itself."""
    model = model_factory("llama", **dict(ggufgen.TINY, context_length=32768))
    d = daemon_factory("--parallel", "2")
    c = d.client()
    c.load(str(model), n_ctx=32768)
    _, greedy = next(_long_streams(d, model, 1, temperature=0))
    it = iter(greedy)
    assert next(it)
    ((_, other),) = _long_streams(d, model, 1, temperature=0, deterministic=False)
    row = until(
        lambda: (r := _row(c, model))["in_flight"] + r["queued"] == 2 and r,
        timeout=60,
        what="two requests on the model",
    )
    if "deterministic greedy requests run alone" in (row["parallel_reason"] or "") or (
        row["parallel"] == 1
    ):
        assert (row["in_flight"], row["queued"]) == (1, 1)
    greedy.close()
    assert next(iter(other))  # it starts once the greedy one has ended
    other.close()


def test_parallel_setting_load_option_and_bad_values(
    daemon_factory: Factory, tiny_model: Path
) -> None:
    d = daemon_factory(env={"MODELD_PARALLEL": "3"})
    c = d.client()
    row = c.load(str(tiny_model))
    assert "the parallel setting" in row["parallel_reason"]
    assert row["parallel"] in (1, 3)
    shown = c.show(str(tiny_model))
    assert shown["parallel"] == row["parallel"]
    assert shown["plan"] == "loaded"
    # a load asking for another value reloads the idle model with it
    row = c.load(str(tiny_model), parallel=2)
    assert "requested by the load" in row["parallel_reason"]
    assert row["parallel"] in (1, 2)
    assert c.stats()["evictions"]["reload"] == 1
    # asking again for the same value does not reload
    c.load(str(tiny_model), parallel=2)
    assert c.stats()["evictions"]["reload"] == 1
    with pytest.raises(InvalidRequestError) as info:
        c.load(str(tiny_model), parallel=0)
    assert "parallel" in info.value.message
    assert c.generate(str(tiny_model), "ok", max_tokens=2, temperature=0).text() is not None


def test_embed_mode_runs_one_sequence(daemon_factory: Factory, tiny_model: Path) -> None:
    d = daemon_factory("--parallel", "4")
    c = d.client()
    row = c.load(str(tiny_model), mode="embed")
    assert row["parallel"] == 1
    assert row["parallel_reason"].startswith("embedding")


def test_bad_parallel_setting_is_refused_at_start(daemon_factory: Factory) -> None:
    d = daemon_factory("--parallel", "65", wait=False)
    assert d.proc.wait(20) == 2
    assert "parallel" in d.log_text()

"""One pool of KV cells shared by the sequences (issue 36, ``kv_unified``) through a real daemon:
the layout from ``modeld load --kv-unified`` to ``ps``/``show``, a long prompt served in the
pool beside a short request without growing, a full pool that grows the reply it stops, and a
deterministic greedy request that runs alone and equals its solo reply. Real daemon, runners,
llama-cpp-python and a tiny generated model."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from cliutil import CliEnv
from daemonutil import rows, until

pytestmark = pytest.mark.slow

Factory = Callable[..., Any]
MODEL = dict(ggufgen.TINY, context_length=2048)
LONG = "a prompt about stones and rivers " * 11  # about 290 tokens
SHORT = "another prompt, short "


def _write(client: Any, model: str, prompt: str, max_tokens: int, **kw: Any
           ) -> tuple[str, dict[str, Any]]:  # fmt: skip
    gen = client.generate(model, prompt, raw=True, max_tokens=max_tokens, temperature=0.0, **kw)
    text = "".join(gen)
    assert gen.done is not None
    return text, dict(gen.done)


def test_the_layout_from_load_to_ps_and_show(model_factory: Factory) -> None:
    model = model_factory("llama", **MODEL)
    with CliEnv.served() as cli:
        row = cli.json("load", str(model), "--ctx", "512", "--parallel", "2", "--kv-unified",
                       "--json")["model"]  # fmt: skip
        assert (row["n_ctx"], row["parallel"], row["kv_unified"]) == (512, 2, True)
        assert "one pool of n_ctx cells shared" in row["parallel_reason"]
        assert "deterministic greedy requests run alone" in row["parallel_reason"]
        (listed,) = cli.json("ps")["models"]
        assert listed["kv_unified"] is True
        assert "512 shared by 2" in cli.run("ps").stdout
        shown = cli.json("show", str(model))
        assert shown["kv_unified"] is True and shown["plan"] == "loaded"
        assert "one pool of n_ctx cells shared" in cli.run("show", str(model)).stdout
        shared = shown["estimate"]["kv_cache"]
        # the separate layout of the same context: a reload, and twice the cells
        row = cli.json("load", str(model), "--ctx", "512", "--parallel", "2", "--kv-separate",
                       "--json")["model"]  # fmt: skip
        assert (row["n_ctx"], row["parallel"], row["kv_unified"]) == (512, 2, False)
        assert "512x2" in cli.run("ps").stdout
        separate = cli.json("show", str(model))["estimate"]["kv_cache"]
        assert separate >= 2 * shared * 0.99 and row["estimate_bytes"] > listed["estimate_bytes"]
        assert cli.json("stats")["evictions"]["reload"] == 1


def test_the_config_turns_it_on_and_a_long_prompt_needs_no_growth(
    daemon_factory: Factory, model_factory: Factory
) -> None:
    model = str(model_factory("llama", **MODEL))
    d = daemon_factory(env={"MODELD_KV_UNIFIED": "1"})
    c = d.client(timeout=300)
    row = c.load(model, n_ctx=512, parallel=2)
    assert row["kv_unified"] is True and row["n_ctx"] == 512
    beside: dict[str, Any] = {}
    other = d.client(timeout=300)
    thread = threading.Thread(target=lambda: beside.update(
        done=_write(other, model, SHORT, 150)[1]))
    thread.start()
    until(lambda: rows(c)[Path(model).name]["in_flight"] == 1, timeout=60, what="the short one")
    _, done = _write(c, model, LONG, 40, deterministic=False)
    thread.join(300)
    assert done["usage"]["prompt_tokens"] > 256  # over a separate sequence's share of 512
    assert done["usage"]["completion_tokens"] == 40 and done["n_ctx"] == 512
    assert beside["done"]["usage"]["completion_tokens"] == 150
    assert c.stats()["evictions"]["reload"] == 0  # served in the pool, no growth


def test_a_reply_in_a_shared_pool_grows_and_keeps_the_layout(daemon_factory: Factory,
                                                              model_factory: Factory) -> None:
    """A reply that runs out of cells in the pool (the pool being full beside the short one,
    or its own end: which comes first depends on the timing) goes on in a larger pool, still
    shared (the cells carried over by the handoff); the short one is never touched. The full
    pool's own pause is tested in the runner (test_kv_unified_runner.py)."""
    model = str(model_factory("llama", **MODEL))
    d = daemon_factory()
    c = d.client(timeout=300)
    c.load(model, n_ctx=512, parallel=2, kv_unified=True)
    beside: dict[str, Any] = {}
    other = d.client(timeout=300)
    thread = threading.Thread(target=lambda: beside.update(
        done=_write(other, model, SHORT, 150, deterministic=False)[1]))
    thread.start()
    until(lambda: rows(c)[Path(model).name]["in_flight"] == 1, timeout=60, what="the short one")
    _, done = _write(c, model, LONG, 400, deterministic=False)
    thread.join(300)
    assert beside["done"]["usage"]["completion_tokens"] == 150
    assert beside["done"]["finish_reason"] == "length"
    assert done["usage"]["completion_tokens"] == 400, done
    assert done["length_reason"] == "max_tokens" and done["n_ctx"] > 512
    logs = "".join(p.read_text() for p in d.log_dir.glob("runner-*.log"))
    assert "tokens written for the reload" in logs and "tokens restored" in logs
    row = rows(c)[Path(model).name]
    assert row["kv_unified"] is True and row["n_ctx"] == done["n_ctx"]


def test_a_deterministic_greedy_request_runs_alone_and_equals_its_solo_reply(
    daemon_factory: Factory, model_factory: Factory
) -> None:
    """Queued behind a long stream (a pool of 32768: it runs until closed), then alone, in a
    pool cleared of the stream's cells: the reply of the fresh runner's first request."""
    model = str(model_factory("llama", **dict(MODEL, context_length=32768)))
    d = daemon_factory()
    c = d.client(timeout=300)
    c.load(model, n_ctx=32768, parallel=2, kv_unified=True)
    solo, _ = _write(c, model, LONG, 60)  # deterministic: the default at temperature 0
    other = d.client(timeout=300)
    busy = other.generate(model, "0 a", raw=True, max_tokens=30000, temperature=0.0,
                          deterministic=False)  # fmt: skip
    streaming = iter(busy)  # held: a dropped iterator closes (cancels) its stream
    assert next(streaming)
    got: dict[str, Any] = {}
    mine = d.client(timeout=300)
    thread = threading.Thread(target=lambda: got.update(reply=_write(mine, model, LONG, 60)))
    thread.start()
    row = until(lambda: (r := rows(c)[Path(model).name])["queued"] == 1 and r, timeout=60,
                what="the deterministic request queued")  # fmt: skip
    assert row["in_flight"] == 1  # the streaming one decodes; this one waits for it
    busy.close()
    thread.join(300)
    text, done = got["reply"]
    assert text == solo and done["usage"]["completion_tokens"] == 60
    assert done["timings"]["batched_max"] == 1

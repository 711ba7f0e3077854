"""A reload for a longer prompt carries the evaluated prefix (issue 36): the old runner writes
its sequences' cells, the new one restores them into its larger context, and the request that
grew the context evaluates only what is new; the context grows with headroom (doubled), and a
greedy reply is the one a fresh evaluation at that context gives. Real daemon, real runners,
a generated model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from daemonutil import rows

Factory = Callable[..., Any]
LONG = dict(ggufgen.TINY, context_length=32768)
WORDS = "a long shared system prompt about stones and rivers and tools "


def _ask(client: Any, model: str, prompt: str) -> tuple[str, dict[str, Any]]:
    gen = client.generate(model, prompt, raw=True, max_tokens=6, temperature=0.0)
    text = gen.text()
    assert gen.done is not None
    return text, dict(gen.done)


@pytest.mark.parametrize("parallel", [1, 2])
def test_growth_evaluates_only_what_is_new(daemon_factory: Factory, model_factory: Factory,
                                           parallel: int) -> None:
    model = str(model_factory("llama", **LONG))
    first, grown = WORDS * 8, WORDS * 14
    d = daemon_factory()
    c = d.client()
    c.load(model, n_ctx=512, parallel=parallel)
    _, done = _ask(c, model, first)
    assert 300 < done["usage"]["prompt_tokens"] < 500, done["usage"]
    text, done = _ask(c, model, grown)  # outgrows 512 cells: a reload
    n_prompt, reused = done["usage"]["prompt_tokens"], done["usage"]["prompt_tokens_reused"]
    assert 512 < n_prompt < 1000 and done["n_ctx"] == 1024  # doubled, not just enough
    assert reused >= 256, done["usage"]  # the first prompt's stable prefix came along
    (row,) = rows(c).values()
    assert row["n_ctx"] == 1024 and "reload" not in str(row.get("state"))
    logs = "".join(p.read_text() for p in d.log_dir.glob("runner-*.log"))
    assert "tokens written for the reload" in logs and "tokens restored" in logs

    # the same greedy reply as a fresh evaluation at that context (no prompt cache there)
    fresh = daemon_factory("--prompt-cache-mib", "0")
    f = fresh.client()
    f.load(model, n_ctx=1024, parallel=parallel)
    again, done = _ask(f, model, grown)
    assert done["usage"]["prompt_tokens_reused"] == 0 and again == text
    leftovers = list((d.root / "prompts").glob("handoff-*"))
    assert leftovers == []  # the new runner deleted what it took over


def test_a_handoff_nobody_writes_ends_the_wait_when_its_writer_is_gone(tmp_path: Path) -> None:
    import os
    import subprocess
    import time

    from modeld.runner import handoff

    prefix = str(tmp_path / "handoff-r9-x")
    gone = subprocess.Popen(["true"])
    gone.wait()
    t0 = time.monotonic()
    assert handoff.wait_manifest(prefix, handoff.pid_alive(gone.pid), wait_s=20) == []
    assert time.monotonic() - t0 < 5  # not the whole wait
    handoff.write_manifest(prefix, [{"seq": 0, "file": prefix + ".0.seq", "tokens": 3,
                                     "stable": 0}])
    assert handoff.wait_manifest(prefix, handoff.pid_alive(os.getpid()))[0]["tokens"] == 3
    old = tmp_path / "handoff-r1-old.0.seq"
    old.write_bytes(b"x")
    os.utime(old, (1, 1))
    handoff.prune_stale(tmp_path)
    assert not old.exists() and handoff.manifest(prefix).exists()  # only the stale one went

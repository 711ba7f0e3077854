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
    assert row["ctx_reason"] == f"grown to 1024 for a {n_prompt}-token prompt"  # not "requested"
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


@pytest.mark.parametrize("grow", [True, False])
def test_a_reply_that_does_not_come_back_still_reuses_the_previous_prompt(
    daemon_factory: Factory, model_factory: Factory, grow: bool
) -> None:
    """A sliding-window model's cells can only be cut back to within a window of their end, so
    when the next prompt does not repeat the previous reply's tokens (an agent's history
    re-tokenized otherwise) the live cells give nothing; the snapshot of the previous prompt
    still does, in the same runner and, carried by the handoff, after a growth."""
    model = str(model_factory("gemma3", **ggufgen.SWA))  # a 64-token window
    d = daemon_factory()
    c = d.client()
    c.load(model, n_ctx=1024 if grow else 2048, parallel=1)
    first = WORDS * 20  # past the window and the batch llama.cpp adds to it: cells are reused
    # The window's cells live in a ring of 768 (64 + a 512-token batch, padded to 256): after
    # a growth only the last 64 positions' cells are restored, so any reply leaves the first
    # prompt's end uncuttable; in the same runner a reply past 704 tokens does.
    reply_tokens = 24 if grow else 720
    sampled = dict(raw=True, temperature=0.8, seed=7)
    # A random-weight model samples its end-of-text now and then: which draw does depends on
    # the last bits of its logits, so on the CPU's kernels (this seed's reply ended at 616
    # tokens on an AVX-512 build, ran its 720 on AVX2). The reply must fill the window's ring,
    # so seeds are tried until one does (each attempt leaves the same first prompt behind).
    for seed in range(7, 27):
        sampled["seed"] = seed
        gen = c.generate(model, first, max_tokens=reply_tokens, **sampled)
        reply = gen.text()
        assert gen.done is not None
        if gen.done["usage"]["completion_tokens"] == reply_tokens:
            break
    assert gen.done["usage"]["completion_tokens"] == reply_tokens, gen.done
    n_first = gen.done["usage"]["prompt_tokens"]
    assert 900 < n_first < 990
    second = first + "\nstones " * 80
    assert not second.startswith(first + reply)
    gen = c.generate(model, second, max_tokens=8, **sampled)
    gen.text()
    assert gen.done is not None
    usage = gen.done["usage"]
    assert usage["prompt_tokens"] > 1024
    assert usage["prompt_tokens_reused"] == n_first, usage
    assert gen.done["n_ctx"] == 2048
    logs = "".join(p.read_text() for p in d.log_dir.glob("runner-*.log"))
    assert ("1 snapshot(s) added" in logs) == grow

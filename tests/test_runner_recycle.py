"""Runner reuse on eviction: an evicted model's process closes the model, gives the memory back
and becomes the spare, so a model switch starts no new process (bench trace: the switch cost).
That is what runners started as new processes do (``--no-runner-fork``: GPU builds, or
``runner_fork`` off); forked runners exit instead (tests/test_runner_fork.py).

Real daemon, runners and generated models; the observable facts are runner pids in ``ps`` and
the child processes of the daemon.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemonutil import children as _children
from daemonutil import until

MiB = 1 << 20


def _row(client: Any, path: Path) -> dict[str, Any] | None:
    for r in client.ps():
        if r["path"] == str(path.resolve()) and r["state"] == "ready":
            return dict(r)
    return None


def test_evicted_runner_becomes_the_next_runner(
    daemon_factory: Callable[..., Any], model_factory: Callable[..., Path]
) -> None:
    models = [
        model_factory("llama", n_layer=2, n_embd=256, n_head=4, n_ff=512, n_vocab=4000, seed=s)
        for s in (31, 32, 33)
    ]
    probe = daemon_factory("--no-spare", "--ctx-floor", "512", "--ctx-ceiling", "512")
    need = max(int(probe.client().show(str(m))["need_bytes"]) for m in models)
    probe.stop()
    handle = daemon_factory(
        "--no-runner-fork", "--memory-cap", str(int(need * 2.5)), "--ctx-floor", "512",
        "--ctx-ceiling", "512", "--keep-alive", "-1",
    )
    c = handle.client()
    greedy = {"raw": True, "max_tokens": 2, "temperature": 0.0, "seed": 0}
    pids: dict[int, int] = {}
    for i in (0, 1):
        c.generate(str(models[i]), "hello", **greedy).text()
        row = _row(c, models[i])
        assert row is not None
        pids[i] = row["runner_pid"]
    # The third model does not fit: one of the first two is evicted; its runner is reused.
    until(lambda: len(_children(handle.proc.pid)) == 3, what="a spare next to two models")
    before = _children(handle.proc.pid)
    c.generate(str(models[2]), "hello", **greedy).text()
    loaded = {i for i in (0, 1) if _row(c, models[i]) is not None}
    assert len(loaded) == 1
    victim = ({0, 1} - loaded).pop()
    # No process was started for the switch: the victim's runner stays, as the spare.
    until(lambda: _children(handle.proc.pid) == before, what="the same three runners")
    assert pids[victim] in _children(handle.proc.pid)
    third = _row(c, models[2])
    assert third is not None and third["runner_pid"] in before
    # Bring the victim back: it loads in a reused process too, and memory accounting held.
    c.generate(str(models[victim]), "hello", **greedy).text()
    until(lambda: _children(handle.proc.pid) == before, what="still the same runners")
    stats = c.stats()
    assert stats["used_bytes"] <= stats["budget_bytes"]
    assert stats["loads"] == 4 and stats["evictions"]["memory"] == 2
    assert "is reused as the spare" in handle.log_text()


def test_runner_unload_reports_what_it_still_holds(
    daemon_factory: Callable[..., Any], tiny_model: Path
) -> None:
    """An explicit unload also goes through reuse; the daemon's accounting drops to zero."""
    handle = daemon_factory("--no-runner-fork")
    c = handle.client()
    until(lambda: len(_children(handle.proc.pid)) == 1, what="the spare")
    c.load(str(tiny_model))
    until(lambda: len(_children(handle.proc.pid)) == 2, what="a new spare after the load")
    runners = _children(handle.proc.pid)
    c.unload(str(tiny_model))
    until(lambda: c.stats()["used_bytes"] == 0, what="memory released")
    # One of the two idle runners is stopped (only one spare is kept); none is started.
    until(lambda: len(_children(handle.proc.pid)) == 1, what="one spare left")
    assert _children(handle.proc.pid) <= runners

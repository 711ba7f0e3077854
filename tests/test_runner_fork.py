"""The runner fork server: runners forked from a process that imported llama_cpp.

Real daemon, fork server, runners and generated models. What a user relies on: replies are the
same as from a runner started as a new process; a forked runner shares its imports (its PSS is
well under its RSS); it is the daemon's child (exit codes, crash reports and process-group
kills work as before); an evicted runner exits instead of being kept; and when the fork server
is gone the daemon goes on starting runners as new processes.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from daemonutil import alive as _alive
from daemonutil import children as _children
from daemonutil import until
from modeld.daemon import forkserver
from modeld.runner import zygote

Factory = Callable[..., Any]
MiB = 1 << 20
GREEDY = {"raw": True, "max_tokens": 8, "temperature": 0.0, "seed": 0}


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read()


def _rollup(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh:
            parts = line.split()
            if parts[0] in ("Rss:", "Pss:"):
                out[parts[0][:-1].lower()] = int(parts[1]) * 1024
    return out


def _runner_pid(client: Any, model: Path) -> int:
    (row,) = [r for r in client.ps() if r["path"] == str(model.resolve())]
    return int(row["runner_pid"])


def test_forked_runner_answers_like_a_new_process_and_shares_its_imports(
    daemon_factory: Factory, tiny_model: Path
) -> None:
    plain = daemon_factory("--no-runner-fork")
    want = plain.client().generate(str(tiny_model), "hello there", **GREEDY).text()
    assert plain.client().stats()["fork_server_pid"] is None
    plain.stop()

    d = daemon_factory()
    c = d.client()
    server = c.stats()["fork_server_pid"]
    assert isinstance(server, int) and server in _children(d.proc.pid)
    assert c.generate(str(tiny_model), "hello there", **GREEDY).text() == want
    runner = _runner_pid(c, tiny_model)
    assert runner in _children(d.proc.pid)  # re-parented to the daemon, not the fork server
    assert os.getpgid(runner) == runner  # leads its own process group (stall kills)
    assert _cmdline(runner).startswith(b"modeld.runner --id ")
    assert f"(pid {runner}, forked)" in d.log_text()
    mem = _rollup(runner)
    # the interpreter, numpy, jinja2 and llama_cpp's bindings are the fork server's pages
    assert mem["rss"] - mem["pss"] > 8 * MiB, mem


def test_no_spare_is_forked_after_the_baseline_but_an_unloaded_runner_is_reused(
    daemon_factory: Factory, tiny_model: Path, model_factory: Factory
) -> None:
    d = daemon_factory()
    c = d.client()
    until(lambda: c.stats()["runner_baseline_bytes"] != 0 and c.stats()["spare_runner"],
          what="the first spare's hello")  # fmt: skip
    c.load(str(tiny_model))
    runner = _runner_pid(c, tiny_model)
    server = c.stats()["fork_server_pid"]
    # the spare became the model's runner; no new spare is forked while none is needed
    until(lambda: _children(d.proc.pid) == {server, runner}, what="fork server + one runner")
    assert c.stats()["spare_runner"] is False
    # a second model gets a fresh fork, in milliseconds
    other = model_factory("llama", **{**_tiny(), "seed": 78})
    c.load(str(other))
    second = _runner_pid(c, other)
    assert second not in (runner, server) and _cmdline(second).startswith(b"modeld.runner")
    # an unloaded model's runner gave its memory back: it stays, as the spare ...
    c.unload(str(tiny_model))
    until(lambda: c.stats()["spare_runner"], what="the unloaded runner kept as the spare")
    assert _alive(runner) and c.stats()["used_bytes"] > 0  # the other model's
    # ... and the next load runs in it (a reload in a warm process)
    c.load(str(tiny_model))
    assert _runner_pid(c, tiny_model) == runner


def test_a_forked_runner_killed_is_reported_with_its_signal(
    daemon_factory: Factory, tiny_model: Path
) -> None:
    d = daemon_factory()
    c = d.client()
    c.load(str(tiny_model))
    runner = _runner_pid(c, tiny_model)
    os.kill(runner, signal.SIGKILL)
    until(lambda: f"(pid {runner}) exited with code -9" in d.log_text(),
          what="the daemon to reap the runner and read its exit status")  # fmt: skip
    assert not _alive(runner)
    assert c.generate(str(tiny_model), "hi", **GREEDY).text() is not None  # reloaded


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_runners_start_as_processes_when_the_fork_server_is_gone(
    daemon_factory: Factory, tiny_model: Path, model_factory: Factory, sig: int
) -> None:
    """Killed, or stopped (the daemon waits FORK_WAIT_S for it, then kills it)."""
    d = daemon_factory()
    c = d.client()
    c.load(str(tiny_model))
    server = c.stats()["fork_server_pid"]
    os.kill(server, sig)
    other = model_factory("llama", **{**_tiny(), "seed": 77})
    assert c.generate(str(other), "hi", **GREEDY).text() is not None
    pid = _runner_pid(c, other)
    assert b"-m\0modeld.runner\0--endpoint" in _cmdline(pid)  # a new Python process
    assert c.stats()["fork_server_pid"] is None
    assert "runner fork server failed" in d.log_text()
    assert c.generate(str(tiny_model), "hi", **GREEDY).text() is not None  # the forked one
    until(lambda: not _alive(server), what="the fork server to be gone (killed and reaped)")


def test_an_idle_fork_server_exits_and_the_next_runner_starts_it_again(
    daemon_factory: Factory, tiny_model: Path, model_factory: Factory
) -> None:
    d = daemon_factory("--runner-fork-idle-s", "1")
    c = d.client()
    want = c.generate(str(tiny_model), "hello there", **GREEDY).text()
    # pids read from the log: on a loaded machine the server may idle out before any stats call
    stopped = re.compile(r"runner fork server \(pid (\d+)\) stopped after 1 s without a fork")
    found = until(lambda: stopped.search(d.log_text()), timeout=20,
                  what="the fork server to exit after 1 s without a fork")  # fmt: skip
    first = int(found.group(1))
    until(lambda: not _alive(first), what="the idle fork server reaped")
    assert c.stats()["fork_server_pid"] is None
    assert c.generate(str(tiny_model), "hello there", **GREEDY).text() == want  # its runner stays
    # a second model needs a runner: the fork server starts again (a new process) and forks it
    other = model_factory("llama", **{**_tiny(), "seed": 79})
    assert c.generate(str(other), "hi", **GREEDY).text() is not None
    # (read from the log: on a loaded machine the new server may already have idled out again)
    started = re.findall(r"runner fork server started again \(pid (\d+)\)", d.log_text())
    assert started and int(started[-1]) != first
    runner = _runner_pid(c, other)
    assert runner in _children(d.proc.pid) and runner != int(started[-1])
    assert _cmdline(runner).startswith(b"modeld.runner --id ")
    assert f"(pid {runner}, forked)" in d.log_text()
    # and both models keep answering
    assert c.generate(str(tiny_model), "hello there", **GREEDY).text() == want


def test_the_fork_server_and_its_runners_end_with_a_killed_daemon(
    daemon_factory: Factory, tiny_model: Path
) -> None:
    d = daemon_factory()
    c = d.client()
    c.load(str(tiny_model))
    pids = [_runner_pid(c, tiny_model), c.stats()["fork_server_pid"]]
    d.stop(signal.SIGKILL)
    until(lambda: not any(_alive(p) for p in pids), timeout=30,
          what="the fork server and the runner to exit")  # fmt: skip


def _tiny() -> dict[str, Any]:
    import ggufgen

    return dict(ggufgen.TINY)


# ---------------------------------------------------------------------- the parts on their own


def test_wire_round_trip_and_bad_lines() -> None:
    msg = {"id": "r3", "argv": ["--endpoint", "ipc:///x", "--id", "r3"], "log": "/tmp/l"}
    line = zygote.encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert zygote.decode(line) == msg
    with pytest.raises(ValueError):
        zygote.decode(b"[1, 2]\n")
    with pytest.raises(ValueError):
        zygote.decode(b"not json\n")


def test_forked_process_reports_exit_codes_like_popen() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    proc = forkserver.ForkedProcess(pid)
    assert proc.wait(10) == 3 and proc.poll() == 3
    pid = os.fork()
    if pid == 0:
        signal.pause()
        os._exit(0)
    proc = forkserver.ForkedProcess(pid)
    assert proc.poll() is None
    with pytest.raises(Exception, match="timed out"):
        proc.wait(0.05)
    proc.kill()
    assert proc.wait(10) == -signal.SIGKILL


def test_not_used_with_threads_or_gpu_backends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert forkserver.unusable() == "the daemon already runs threads"
    finally:
        stop.set()
        t.join()
    pkg = tmp_path / "llama_cpp"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "lib" / "libggml-cpu.so").touch()
    spec = type("Spec", (), {"submodule_search_locations": [str(pkg)]})()
    monkeypatch.setattr(forkserver.importlib.util, "find_spec", lambda name: spec)
    assert forkserver.gpu_backends() == []
    (pkg / "lib" / "libggml-cuda.so").touch()
    assert forkserver.gpu_backends() == ["cuda"]

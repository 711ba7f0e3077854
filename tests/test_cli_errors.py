"""Errors as a script sees them, on both CLI paths (the fast path and the Typer CLI).

The fast path hands a command to the Typer CLI only before it has sent anything: once a request
is out, an error is reported by the fast path itself, with the one formatter both paths share
(``render.report_error``). Handing over later re-ran requests: a refused ``run`` was sent again
with stdin already consumed (so with part of the prompt), a failed ``load`` twice.
Also here: client-side OS errors on the socket path, each one line with a hint and exit 3.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cliutil import GREEDY, CliEnv
from daemonutil import until

FAST_OFF = {"MODELD_NO_FAST": "1"}


@pytest.fixture()
def cli() -> Iterator[CliEnv]:
    with CliEnv.served() as env:
        yield env


def requests_seen(cli: CliEnv) -> int:
    return int(cli.json("stats")["requests"])


def error_line(stderr: str) -> list[str]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines and lines[0].startswith("modeld: error: "), stderr
    assert "Traceback" not in stderr
    return lines


def test_refused_prompt_from_stdin_is_not_sent_again(cli: CliEnv, tiny_model: Path) -> None:
    """`cat long.txt | modeld run MODEL "Summarise:"`: refused once, reported once, exit 9."""
    model = str(tiny_model)
    long_text = " ".join(f"word{i}" for i in range(40_000))
    before = requests_seen(cli)
    fast = cli.run("run", model, "Summarise:", input=long_text)
    assert fast.returncode == 9, (fast.returncode, fast.stdout, fast.stderr)
    assert fast.stdout == ""
    assert "tokens" in error_line(fast.stderr)[0]
    assert requests_seen(cli) == before + 1  # sent once: no second, shorter request

    full = cli.run("run", model, "Summarise:", input=long_text, env_extra=FAST_OFF)
    assert (full.returncode, full.stdout) == (fast.returncode, fast.stdout)
    # Same formatter: identical text but for the numbers that depend on the request.
    assert error_line(full.stderr)[0].split(":")[:2] == error_line(fast.stderr)[0].split(":")[:2]
    assert requests_seen(cli) == before + 2


@pytest.mark.parametrize("json_out", [False, True])
def test_failed_load_is_sent_once_and_reported_alike(
    cli: CliEnv, tiny_model: Path, json_out: bool
) -> None:
    """A model file that is cut short: the daemon accepts the request and the load fails."""
    data = tiny_model.read_bytes()
    (cli.root / "models" / "broken.gguf").write_bytes(data[: len(data) // 2])
    args = ["load", "broken", *(["--json"] if json_out else [])]
    before = requests_seen(cli)
    fast = cli.run(*args)
    assert requests_seen(cli) == before + 1
    full = cli.run(*args, env_extra=FAST_OFF)
    assert requests_seen(cli) == before + 2
    assert fast.returncode == full.returncode == 5  # invalid_model
    assert fast.stderr == full.stderr
    error_line(fast.stderr)
    if json_out:
        doc = json.loads(fast.stdout)
        assert doc == json.loads(full.stdout)
        assert doc["kind"] == "error" and doc["error"]["code"] == "invalid_model"
    else:
        assert fast.stdout == full.stdout == ""


@pytest.mark.parametrize(("model", "code"), [("no-such-model", 4), ("broken", 5)])
def test_run_errors_are_reported_alike(cli: CliEnv, tiny_model: Path, model: str, code: int
                                       ) -> None:
    data = tiny_model.read_bytes()
    (cli.root / "models" / "broken.gguf").write_bytes(data[:4096])
    fast = cli.run("run", model, "hello there", input="and more from stdin")
    full = cli.run("run", model, "hello there", input="and more from stdin", env_extra=FAST_OFF)
    assert fast.returncode == full.returncode == code
    assert fast.stderr == full.stderr and fast.stdout == full.stdout == ""
    error_line(fast.stderr)


def test_error_after_streaming_keeps_what_was_printed(cli: CliEnv, default_model: Path) -> None:
    """The runner dies mid-reply: stdout holds exactly the streamed text (a prefix of the
    greedy reply, never a replay), the exit code says runner_crashed (7)."""
    args = ["run", str(default_model), "--raw", *GREEDY, "--max-tokens", "300",
            "1, 2, 3, 4, 5,"]
    reference = cli.run(*args)
    assert reference.returncode == 0, reference.stderr
    before = requests_seen(cli)
    proc = cli.popen(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    os.set_blocking(proc.stdout.fileno(), False)
    got = b""

    def streamed() -> bool:
        nonlocal got
        got += proc.stdout.read() or b""  # type: ignore[union-attr]
        return len(got) > 20

    until(streamed, timeout=60, what="the reply to start streaming")
    (row,) = [r for r in cli.json("ps")["models"] if r["in_flight"]]
    os.kill(int(row["runner_pid"]), signal.SIGKILL)
    os.set_blocking(proc.stdout.fileno(), True)
    rest, err = proc.communicate(timeout=60)
    out = (got + rest).decode()
    assert proc.returncode == 7, (proc.returncode, err)
    assert reference.stdout.startswith(out) and 20 < len(out) < len(reference.stdout)
    assert error_line(err.decode())
    assert requests_seen(cli) == before + 1


# ---------------------------------------------------------------------- socket path errors


def _env_with_socket(path: Path) -> CliEnv:
    env = CliEnv.create()
    env.env["MODELD_SOCKET"] = f"ipc://{path}"
    return env


def _one_line_exit_3(env: CliEnv, *args: str) -> str:
    for extra in ({}, FAST_OFF):
        out = env.run(*args, env_extra=extra)
        assert out.returncode == 3, (args, extra, out.returncode, out.stderr)
        lines = error_line(out.stderr)
        assert len(lines) == 2 and lines[1].lstrip().startswith("hint: "), out.stderr
    return lines[0]


def test_a_regular_file_at_the_socket_path(tmp_path: Path) -> None:
    bogus = tmp_path / "modeld.sock"
    bogus.write_text("not a socket")
    env = _env_with_socket(bogus)
    try:
        assert "is not a socket" in _one_line_exit_3(env, "ps")
        assert "is not a socket" in _one_line_exit_3(env, "run", "default", "hello there")
    finally:
        env.cleanup()


def test_a_stale_socket_nobody_listens_on(tmp_path: Path) -> None:
    path = Path("/tmp") / f"mdstale-{os.getpid()}.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))  # bound, never listening: connect() is refused
    env = _env_with_socket(path)
    try:
        started = time.monotonic()
        assert "stale socket" in _one_line_exit_3(env, "ps")
        assert time.monotonic() - started < 60  # refused at once, not a hang (bound, loose)
    finally:
        s.close()
        path.unlink(missing_ok=True)
        env.cleanup()


def test_a_socket_path_under_a_file(tmp_path: Path) -> None:
    """ENOTDIR: a path component is a file (and a missing path is ENOENT: exit 3 too)."""
    afile = tmp_path / "file"
    afile.write_text("")
    env = _env_with_socket(afile / "modeld.sock")
    try:
        assert "cannot use the daemon socket" in _one_line_exit_3(env, "ps")
    finally:
        env.cleanup()
    env = _env_with_socket(tmp_path / "none" / "modeld.sock")
    try:
        assert "daemon not running" in _one_line_exit_3(env, "ps")
    finally:
        env.cleanup()


def test_permission_denied_on_the_socket(tmp_path: Path) -> None:
    """EACCES: the daemon's directory belongs to another user. Tests run as root, where
    permissions do not stop anyone, so the client runs as nobody when that is possible."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the client as another user")
    private = Path("/tmp") / f"mdperm-{os.getpid()}"
    private.mkdir(mode=0o700)
    path = private / "modeld.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen(1)
    env = _env_with_socket(path)
    try:
        os.chmod(env.root, 0o755)
        for extra in ({}, FAST_OFF):
            out = subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                 str(Path(_modeld())), "ps"],
                env=dict(env.env, HOME=str(env.root), **extra), capture_output=True, text=True,
                timeout=60, cwd="/",
            )
            assert out.returncode == 3, (extra, out.returncode, out.stderr)
            assert "permission denied" in error_line(out.stderr)[0]
    finally:
        s.close()
        path.unlink(missing_ok=True)
        private.rmdir()
        env.cleanup()


def _modeld() -> str:
    from cliutil import MODELD

    return MODELD


def test_show_plans_nothing_for_a_loaded_model(cli: CliEnv, tiny_model: Path) -> None:
    """The dry run never evicts the model it describes: loaded with enough context it is
    "loaded"; asked for more context it is a reload that says what it frees and costs."""
    loaded = cli.json("load", str(tiny_model), "--ctx", "512")["model"]
    assert loaded["n_ctx"] == 512
    same = cli.json("show", str(tiny_model))
    assert same["plan"] == "loaded" and same["would_evict"] == []
    assert same["n_ctx"] == loaded["n_ctx"] and same["fits"] is True
    smaller = cli.json("show", str(tiny_model), "--ctx", "256")
    assert smaller["plan"] == "loaded"
    bigger_ctx = 1024
    grow = cli.json("show", str(tiny_model), "--ctx", str(bigger_ctx))
    assert grow["plan"] == "reload", grow
    assert grow["would_evict"] == []
    assert grow["reload"]["from_n_ctx"] == loaded["n_ctx"]
    assert grow["reload"]["to_n_ctx"] == bigger_ctx
    assert grow["reload"]["frees_bytes"] == loaded["accounted_bytes"]
    assert f"n_ctx {bigger_ctx}" in grow["plan_reason"] and "frees" in grow["plan_reason"]
    text = cli.run("show", str(tiny_model))
    assert text.returncode == 0 and "already loaded" in text.stdout

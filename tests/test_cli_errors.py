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
    assert full.stderr == fast.stderr  # the same request, the same formatter: the same text
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


def alike(cli: CliEnv, *args: str, code: int, counted: int = 1) -> str:
    """``modeld ARGS`` with a prompt argument and stdin, on the fast path then the Typer CLI:
    same exit code, same stderr, nothing on stdout, and each sent once (``counted`` requests in
    the daemon's stats: a request refused before it is queued is not counted). The message."""
    runs = []
    for extra in ({}, FAST_OFF):
        before = requests_seen(cli)
        runs.append(cli.run(*args, input="and more from stdin", env_extra=extra))
        assert requests_seen(cli) == before + counted, (extra, runs[-1].stderr)
    fast, full = runs
    assert fast.returncode == full.returncode == code, (fast.stderr, full.stderr)
    assert fast.stderr == full.stderr and fast.stdout == full.stdout == ""
    return error_line(fast.stderr)[0]


@pytest.mark.parametrize(
    ("model", "code", "counted"), [("no-such-model", 4, 0), ("broken", 5, 1)]
)
def test_run_errors_are_reported_alike(
    cli: CliEnv, tiny_model: Path, model: str, code: int, counted: int
) -> None:
    """model_not_found is refused before it is queued (not counted); invalid_model is a load
    that fails (counted once)."""
    data = tiny_model.read_bytes()
    (cli.root / "models" / "broken.gguf").write_bytes(data[:4096])
    alike(cli, "run", model, "hello there", code=code, counted=counted)


@pytest.mark.parametrize(
    ("opts", "word"),
    [
        (["--temperature", "-3"], "temperature"),
        (["--max-tokens", "0"], "max_tokens"),
        (["--top-k", "-1"], "top_k"),
        (["--ctx", "100000000"], "n_ctx"),
        (["--keep-alive", "soon"], "keep_alive"),
        (["--stop", ""], "stop"),
    ],
)
def test_invalid_requests_are_reported_alike(
    cli: CliEnv, tiny_model: Path, opts: list[str], word: str
) -> None:
    """Values the daemon refuses (invalid_request, exit 2), never queued so never counted."""
    line = alike(cli, "run", str(tiny_model), *opts, "hello there", code=2, counted=0)
    assert word in line


def test_insufficient_memory_is_reported_alike(tiny_model: Path) -> None:
    """A budget below the runner baseline: the daemon refuses every load (exit 6)."""
    with CliEnv.served("--memory-cap", "16MiB") as cli:
        line = alike(cli, "run", str(tiny_model), "hello there", code=6)
        assert "budget" in line


def test_queue_full_is_reported_alike(tiny_model: Path, default_model: Path) -> None:
    """max_queue 1, parallel 1, one request running (its runner stopped so it stays running),
    one queued: the next is refused at once with timeout (exit 8), the same on both paths."""
    env = CliEnv.create()
    # runner_stall_s: the stopped runner must not be taken for a stalled one meanwhile
    # parallel 1: the second request queues (greedy requests share decode steps otherwise)
    (env.root / "config.toml").write_text("max_queue = 1\nrunner_stall_s = 3600\nparallel = 1\n")
    running: list[subprocess.Popen[bytes]] = []
    try:
        env.serve()
        args = ["run", str(default_model), "--raw", *GREEDY, "--max-tokens", "2000", "1, 2, 3,"]
        running.append(env.popen(*args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
        until(lambda: any(r["in_flight"] for r in env.json("ps")["models"]), timeout=120,
              what="the first request to run")
        (row,) = env.json("ps")["models"]
        os.kill(int(row["runner_pid"]), signal.SIGSTOP)
        running.append(env.popen(*args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        until(lambda: env.json("ps")["models"][0]["queued"] == 1, timeout=60,
              what="the second request to queue")
        line = alike(env, "run", str(default_model), "hello there", code=8, counted=0)
        assert "queued" in line
        os.kill(int(row["runner_pid"]), signal.SIGKILL)
    finally:
        for proc in running:
            proc.kill()
            proc.wait(30)
        env.cleanup()


def test_daemon_stopping_mid_reply_keeps_what_was_printed(default_model: Path) -> None:
    """`modeld stop` while a reply streams: stdout keeps the streamed prefix, the error says
    the daemon is shutting down (daemon_unavailable, exit 3), nothing is run again."""
    env = CliEnv.create()
    try:
        env.serve()
        args = ["run", str(default_model), "--raw", *GREEDY, "--max-tokens", "300",
                "1, 2, 3, 4, 5,"]
        reference = env.run(*args)
        assert reference.returncode == 0, reference.stderr
        proc = env.popen(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        got = _stream_until(proc, 20)
        assert env.run("stop").returncode == 0
        rest, err = proc.communicate(timeout=60)  # type: ignore[union-attr]
        out = (got + rest).decode()
        assert proc.returncode == 3, (proc.returncode, err)
        assert reference.stdout.startswith(out) and 20 < len(out) < len(reference.stdout)
        assert "shutting down" in error_line(err.decode())[0]
        assert env.serve_proc is not None and env.serve_proc.wait(60) == 0
    finally:
        env.cleanup()


def _stream_until(proc: subprocess.Popen[bytes], n: int) -> bytes:
    """What ``proc`` printed once it printed more than ``n`` bytes (stdout left blocking)."""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    got = b""

    def streamed() -> bool:
        nonlocal got
        got += proc.stdout.read() or b""  # type: ignore[union-attr]
        return len(got) > n

    until(streamed, timeout=120, what="the reply to start streaming")
    os.set_blocking(proc.stdout.fileno(), True)
    return got


def test_error_after_streaming_keeps_what_was_printed(cli: CliEnv, default_model: Path) -> None:
    """The runner dies mid-reply: stdout holds exactly the streamed text (a prefix of the
    greedy reply, never a replay), the exit code says runner_crashed (7)."""
    args = ["run", str(default_model), "--raw", *GREEDY, "--max-tokens", "300",
            "1, 2, 3, 4, 5,"]
    reference = cli.run(*args)
    assert reference.returncode == 0, reference.stderr
    before = requests_seen(cli)
    proc = cli.popen(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    got = _stream_until(proc, 20)
    (row,) = [r for r in cli.json("ps")["models"] if r["in_flight"]]
    os.kill(int(row["runner_pid"]), signal.SIGKILL)
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


def test_a_directory_at_the_socket_path(tmp_path: Path) -> None:
    env = _env_with_socket(tmp_path)
    try:
        assert "is not a socket" in _one_line_exit_3(env, "ps")
        assert "is not a socket" in _one_line_exit_3(env, "load", "default")
    finally:
        env.cleanup()


def test_an_endpoint_zeromq_cannot_connect_to() -> None:
    """A tcp endpoint without a port: ZeroMQ's connect() fails (EINVAL): exit 3, one line."""
    env = CliEnv.create()
    env.env["MODELD_SOCKET"] = "tcp://localhost"
    try:
        assert "cannot connect to tcp://localhost" in _one_line_exit_3(env, "ps")
    finally:
        env.cleanup()


@pytest.mark.parametrize("endpoint", ["bogus://x", "ipc://", "tcp://"])
def test_a_malformed_endpoint_is_a_settings_error(endpoint: str) -> None:
    """Not an OS error but a bad setting: exit 2 like every invalid setting, never the
    ZMQError traceback it used to be, on both paths and for `serve`."""
    env = CliEnv.create()
    env.env["MODELD_SOCKET"] = endpoint
    try:
        for args, extra in ((["ps"], {}), (["ps"], FAST_OFF), (["run", "default", "hi"], {}),
                            (["serve"], {})):
            out = env.run(*args, env_extra=extra)
            assert out.returncode == 2, (args, extra, out.stderr)
            assert "MODELD_SOCKET" in error_line(out.stderr)[0]
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
        os.chmod(env.root, 0o755)  # the other user reads the (empty) config file
        os.chmod(env.root / "config.toml", 0o644)
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
    """The dry run never evicts the model it describes: loaded with enough context (the same
    or a smaller one) it is "loaded", with nothing to evict and nothing needed."""
    loaded = cli.json("load", str(tiny_model), "--ctx", "512")["model"]
    assert loaded["n_ctx"] == 512
    for ctx in ([], ["--ctx", "512"], ["--ctx", "256"]):
        same = cli.json("show", str(tiny_model), *ctx)
        assert same["plan"] == "loaded" and same["would_evict"] == [], (ctx, same)
        assert same["n_ctx"] == loaded["n_ctx"] and same["fits"] is True
        assert same["need_bytes"] == 0 and "already loaded" in same["plan_reason"]
    text = cli.run("show", str(tiny_model))
    assert text.returncode == 0 and "already loaded" in text.stdout
    assert "evict" not in text.stdout.replace("nothing to load or evict", "")


def test_show_explains_a_reload_at_a_larger_context(cli: CliEnv, tiny_model: Path) -> None:
    """Asked for more context than it is loaded with, a loaded model is reloaded: the plan
    says so, what the reload frees (the model's own bytes) and what it needs."""
    loaded = cli.json("load", str(tiny_model), "--ctx", "512")["model"]
    bigger_ctx = 1024
    grow = cli.json("show", str(tiny_model), "--ctx", str(bigger_ctx))
    assert grow["plan"] == "reload", grow
    assert grow["would_evict"] == []  # never itself
    assert grow["reload"]["from_n_ctx"] == loaded["n_ctx"]
    assert grow["reload"]["to_n_ctx"] == grow["n_ctx"] == bigger_ctx
    assert grow["reload"]["frees_bytes"] == loaded["accounted_bytes"]
    assert grow["reload"]["needs_bytes"] == grow["need_bytes"] > 0
    assert f"n_ctx {bigger_ctx}" in grow["plan_reason"] and "frees" in grow["plan_reason"]
    text = cli.run("show", str(tiny_model), "--ctx", str(bigger_ctx))
    assert text.returncode == 0 and "reload" in text.stdout


def serve_error(env: CliEnv) -> str:
    """`modeld serve` refused to start: exit 2, one line (a log line once logging is set up,
    else the CLI's error line with its hint), never a traceback. That line."""
    out = env.run("serve")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 or (len(lines) == 2 and "hint: " in lines[1]), out.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("variable", "setting"),
    [("MODELD_LOG_DIR", "log_dir"), ("MODELD_RUNTIME_DIR", "socket"),
     ("MODELD_SOCKET", "socket")],
)
def test_serve_on_a_path_under_a_file(tmp_path: Path, variable: str, setting: str) -> None:
    """A file where `modeld serve` needs a directory: one line naming the path and the
    setting, exit 2 (a setting to fix), no traceback; `run` autostarting says the same."""
    afile = tmp_path / "afile"
    afile.write_text("")
    env = CliEnv.create(autostart=True)
    value = f"ipc://{afile}/modeld.sock" if variable == "MODELD_SOCKET" else str(afile)
    env.env[variable] = value
    if variable != "MODELD_SOCKET":
        env.env.pop("MODELD_SOCKET")  # derived from the runtime dir
    try:
        line = serve_error(env)
        assert f"cannot use {afile} ({setting})" in line
        if variable == "MODELD_LOG_DIR":
            started = env.run("run", "default", "hello there")
            assert started.returncode == 2, started.stderr
            assert f"cannot use {afile} ({setting})" in error_line(started.stderr)[0]
    finally:
        env.cleanup()


def test_serve_on_an_ipc_path_too_long_for_a_unix_socket(tmp_path: Path) -> None:
    env = CliEnv.create()
    env.env["MODELD_SOCKET"] = f"ipc://{tmp_path}/{'x' * 120}.sock"
    try:
        assert "cannot serve on ipc://" in serve_error(env)
    finally:
        env.cleanup()

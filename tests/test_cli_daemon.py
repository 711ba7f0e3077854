"""The CLI against a real daemon, only through the ``modeld`` console script in subprocesses.

One ``modeld serve`` per module on a private socket (started in the background like a user
would), stopped at the end with ``modeld stop``, which must make it exit and remove its socket.
Generations use the generated tiny models, greedy and seeded, so outputs are reproducible.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cliutil import GREEDY, CliEnv, pid_alive, until

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux), spelled out for older Pythons' typeshed


@pytest.fixture(scope="module")
def cli() -> Iterator[CliEnv]:
    with CliEnv.served() as env:
        yield env


def _start_long_run(cli: CliEnv, model: Path) -> subprocess.Popen[bytes]:
    """``modeld run`` of a 2000-token greedy generation, stdout and stderr piped."""
    return cli.popen(
        "run",
        str(model),
        "Write forever",
        "--raw",
        *GREEDY,
        "--max-tokens",
        "2000",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _stats(cli: CliEnv) -> dict[str, Any]:
    return cli.json("stats")


def read_chunks(proc: subprocess.Popen[bytes], bufsize: int = 64) -> tuple[bytes, int]:
    """Read ``proc``'s stdout to EOF in small reads; also count reads made while it still ran."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data, live_reads = b"", 0
    while True:
        chunk = os.read(fd, bufsize)
        if not chunk:
            return data, live_reads
        data += chunk
        if proc.poll() is None:
            live_reads += 1


# ---------------------------------------------------------------------- streaming output


def test_run_pipe_prints_exactly_the_generated_text(cli: CliEnv, tiny_model: Path) -> None:
    args = ("run", str(tiny_model), "Once upon a time", *GREEDY, "--max-tokens", "40")
    plain = cli.stdout_bytes(*args)
    doc = cli.json(*args)
    assert doc["kind"] == "run" and doc["text"]
    # stdout is the text and nothing else: no decoration, no newline added on a pipe.
    assert plain.decode() == doc["text"]
    assert doc["done"]["usage"]["completion_tokens"] == 40


def test_run_streams_long_output_in_pieces(cli: CliEnv, tiny_model: Path) -> None:
    """A long reply arrives on a small pipe in many reads while ``modeld run`` still runs.

    The pipe is shrunk to one page, so a reply longer than that keeps the writer alive while
    we read. That a reply's first bytes come before the generation ends is shown by
    test_closed_pipe_cancels_the_generation and the Ctrl-C test.
    """
    # "hello\n" gives about 5.3 KB of greedy text on the tiny model: more than the pipe holds.
    args = ("run", str(tiny_model), "hello\n", *GREEDY, "--max-tokens", "2000", "--raw")
    proc = cli.popen(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    fcntl.fcntl(proc.stdout.fileno(), F_SETPIPE_SZ, 4096)
    data, live_reads = read_chunks(proc, bufsize=16)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert len(data) > 4096 + 2 * 16, "the reply must outgrow the pipe for this test to mean much"
    assert live_reads > 1, (live_reads, len(data))
    assert data.decode() == cli.json(*args)["text"]


def _first_bytes(proc: subprocess.Popen[bytes]) -> bytes:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    data = os.read(proc.stdout.fileno(), 64) if ready else b""
    assert data, "no output within 60 s"
    return data


def _idle_row(cli: CliEnv, model: Path) -> dict[str, Any] | None:
    row = cli.ps_row(model)
    return row if row and row["state"] == "ready" and row["in_flight"] == 0 else None


def test_closed_pipe_cancels_the_generation(cli: CliEnv, tiny_model: Path) -> None:
    """`modeld run … | head -c 10`: exits quietly and the daemon stops generating.

    Also proves the text is streamed: the first bytes arrive while the 2000-token generation
    is still running (a buffered reply would arrive only after all 2000 tokens were counted).
    """
    before = _stats(cli)["tokens_generated"]
    proc = _start_long_run(cli, tiny_model)
    assert proc.stdout is not None and proc.stderr is not None
    _first_bytes(proc)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(30) == 0, err
    assert "Traceback" not in err
    until(lambda: _idle_row(cli, tiny_model), timeout=30, what="the model idle again")
    assert _stats(cli)["tokens_generated"] - before < 2000


# ---------------------------------------------------------------------- prompts from stdin


def _prompt_tokens(doc: dict[str, Any]) -> int:
    n = doc["done"]["usage"]["prompt_tokens"]
    assert isinstance(n, int)
    return n


def test_stdin_prompt_alone(cli: CliEnv, tiny_model: Path) -> None:
    piped = cli.json(
        "run", str(tiny_model), "--raw", *GREEDY, "--max-tokens", "8", input="hello world\n"
    )
    direct = cli.json(
        "run", str(tiny_model), "hello world\n", "--raw", *GREEDY, "--max-tokens", "8"
    )
    assert _prompt_tokens(piped) == _prompt_tokens(direct) > 0
    assert piped["text"] == direct["text"]
    args = ("run", str(tiny_model), "--raw", "--verbose", *GREEDY, "--max-tokens", "8")
    verbose = cli.run(*args, input="hello world\n")
    assert verbose.returncode == 0, verbose.stderr
    assert f"prompt_tokens={_prompt_tokens(direct)} " in verbose.stderr
    # timings go to stderr, never into the text
    assert cli.stdout_bytes(*args, input="hello world\n").decode() == direct["text"]


def test_stdin_and_argument_combine_prompt_first(
    cli: CliEnv, tiny_model: Path, tmp_path: Path
) -> None:
    body = "The quick brown fox jumps over the lazy dog. " * 6
    (tmp_path / "doc.txt").write_text(body)
    common = ("--raw", *GREEDY, "--max-tokens", "8")
    combined = cli.json("run", str(tiny_model), "Summarise:", *common, input=body)
    instruction = cli.json("run", str(tiny_model), "Summarise:", *common)
    stdin_only = cli.json("run", str(tiny_model), *common, input=body)
    spelled_out = cli.json("run", str(tiny_model), f"Summarise:\n\n{body}", *common)
    assert _prompt_tokens(combined) > _prompt_tokens(stdin_only) > _prompt_tokens(instruction)
    # prompt first, then stdin: exactly the same request as typing it out
    assert _prompt_tokens(combined) == _prompt_tokens(spelled_out)
    assert combined["text"] == spelled_out["text"]
    with open(tmp_path / "doc.txt") as fh:  # `cat file | modeld run MODEL "Summarise:"`
        cat = subprocess.run(
            ["cat", str(tmp_path / "doc.txt")], stdout=subprocess.PIPE, check=True
        ).stdout
        assert cat == fh.read().encode()
    verbose = cli.run(
        "run", str(tiny_model), "Summarise:", "--verbose", *common, input=cat.decode()
    )
    assert verbose.returncode == 0, verbose.stderr
    assert f"prompt_tokens={_prompt_tokens(combined)} " in verbose.stderr


def test_relative_model_path_is_resolved_in_the_callers_directory(
    cli: CliEnv, tiny_model: Path
) -> None:
    out = cli.run(
        "run",
        f"./{tiny_model.name}",
        "hi there",
        *GREEDY,
        "--max-tokens",
        "4",
        cwd=tiny_model.parent,
    )
    assert out.returncode == 0, out.stderr


# ---------------------------------------------------------------------- --json shapes


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


PS_ROW_TYPES: dict[str, Any] = {
    "name": str,
    "path": str,
    "mode": str,
    "state": str,
    "n_ctx": int,
    "ctx_reason": str,
    "measured_bytes": int,
    "estimate_bytes": int,
    "in_flight": int,
    "queued": int,
    "use_count": int,
    "last_used": (int, float),
    "keep_alive_left_s": (int, float),
    "forever": bool,
    "pinned": bool,
}


def check_ps_row(row: dict[str, Any]) -> None:
    for key, typ in PS_ROW_TYPES.items():
        assert isinstance(row.get(key), typ), (key, row.get(key))
    assert row["mode"] in ("generate", "embed")
    assert row["n_ctx"] % 256 == 0


def test_json_run_shape(cli: CliEnv, tiny_model: Path) -> None:
    doc = cli.json("run", str(tiny_model), "Hi there", *GREEDY, "--max-tokens", "5")
    assert doc["schema_version"] == 1 and doc["kind"] == "run"
    assert isinstance(doc["model"], str) and isinstance(doc["text"], str)
    done = doc["done"]
    assert _is_int(done["usage"]["prompt_tokens"]) and done["usage"]["prompt_tokens"] > 0
    assert done["usage"]["completion_tokens"] == 5
    assert done["finish_reason"] in ("length", "stop")
    assert _is_int(done["n_ctx"]) and done["n_ctx"] % 256 == 0
    assert all(_is_num(v) for v in done["timings"].values())


def test_json_load_ps_unload_shapes(cli: CliEnv, tiny_chat_model: Path) -> None:
    loaded = cli.json("load", str(tiny_chat_model), "--ctx", "512", "--keep-alive", "10m")
    assert loaded["kind"] == "load"
    row = loaded["model"]
    check_ps_row(row)
    assert row["state"] == "ready" and row["n_ctx"] == 512
    assert row["path"] == str(tiny_chat_model.resolve())
    assert 590 < row["keep_alive_left_s"] <= 600

    ps = cli.json("ps")
    assert ps["schema_version"] == 1 and ps["kind"] == "ps"
    assert isinstance(ps["models"], list)
    for r in ps["models"]:
        check_ps_row(r)
    assert any(r["path"] == row["path"] for r in ps["models"])

    gone = cli.json("unload", str(tiny_chat_model))
    assert gone["kind"] == "unload"
    assert gone["unloaded"] == [row["name"]] and gone["unloading_when_idle"] == []
    assert cli.ps_row(tiny_chat_model) is None


def test_json_stats_shape(cli: CliEnv, tiny_model: Path) -> None:
    cli.json("run", str(tiny_model), "Hi there", *GREEDY, "--max-tokens", "3")
    stats = _stats(cli)
    assert stats["kind"] == "stats"
    for key in (
        "hits",
        "misses",
        "loads",
        "tokens_generated",
        "prompt_tokens",
        "requests",
        "evictions_total",
        "models_loaded",
        "max_models",
        "pid",
    ):
        assert _is_int(stats[key]), key
    for key in ("budget_bytes", "used_bytes", "uptime_s"):
        assert _is_num(stats[key]) and stats[key] >= 0, key
    assert isinstance(stats["evictions"], dict)
    assert all(_is_int(v) for v in stats["evictions"].values())
    assert sum(stats["evictions"].values()) == stats["evictions_total"]
    samples = stats["estimate_error_samples"]
    assert isinstance(samples, list) and samples and all(_is_num(x) for x in samples)
    assert stats["estimate_error_mean"] == pytest.approx(sum(samples) / len(samples))
    assert stats["tokens_generated"] >= 3 and stats["requests"] >= 1


def test_json_show_from_daemon(cli: CliEnv, tiny_model: Path) -> None:
    doc = cli.json("show", str(tiny_model))
    assert doc["kind"] == "show" and doc["source"] == "daemon"
    assert doc["path"] == str(tiny_model.resolve())
    assert doc["fits"] is True
    assert _is_int(doc["n_ctx"]) and doc["n_ctx"] % 256 == 0
    assert isinstance(doc["ctx_reason"], str) and doc["ctx_reason"]
    assert _is_int(doc["estimate_bytes"]) and doc["estimate_bytes"] > 0
    assert isinstance(doc["would_evict"], list)
    assert doc["info"]["architecture"] == "llama"
    assert doc["estimate"]["total"] == doc["estimate_bytes"]
    assert _is_int(doc["budget_bytes"]) and doc["budget_bytes"] >= doc["need_bytes"]
    assert doc["loaded"] is None or doc["loaded"]["path"] == doc["path"]


def test_json_embed_one_vector_per_input(cli: CliEnv, tiny_model: Path) -> None:
    out = cli.run("embed", str(tiny_model), "first text", "second one", "third")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kind"] == "embed"
    vectors = doc["embeddings"]
    assert len(vectors) == 3
    dims = {len(v) for v in vectors}
    assert dims == {64}  # ggufgen.TINY's n_embd
    assert all(_is_num(x) for v in vectors for x in v)
    assert vectors[0] != vectors[1]
    piped = cli.run("embed", str(tiny_model), "-", input="first text\nsecond one\n")
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["embeddings"] == vectors[:2]


def test_json_list_and_config_shapes(cli: CliEnv, tiny_model: Path) -> None:
    (cli.root / "models" / "tiny.gguf").write_bytes(tiny_model.read_bytes())
    listed = cli.json("list")
    assert listed["kind"] == "list" and listed["models_dir"] == str(cli.root / "models")
    row, default = listed["models"]
    assert default["name"] == "default" and default["source"] == "default"
    assert row["name"] == "tiny" and row["architecture"] == "llama"
    assert row["path"].endswith("tiny.gguf")
    config = cli.json("config")
    assert config["kind"] == "config"
    settings, sources = config["settings"], config["sources"]
    assert isinstance(settings, dict) and isinstance(sources, dict)
    assert set(sources) <= set(settings)
    assert _is_int(settings["max_models"]) and isinstance(settings["keep_alive"], (str, int, float))
    assert sources["models_dir"] == "env:MODELD_MODELS"


# ---------------------------------------------------------------------- exit codes


def test_exit_usage_2(cli: CliEnv, tiny_model: Path) -> None:
    out = cli.run("run", str(tiny_model), "hi", "--max-tokens", "many")
    assert out.returncode == 2
    assert out.stdout == ""
    no_prompt = cli.run("run", str(tiny_model))  # stdin is /dev/null: nothing to send
    assert no_prompt.returncode == 2 and "no prompt" in no_prompt.stderr


def test_exit_daemon_unavailable_3(tiny_model: Path) -> None:
    lonely = CliEnv.create()  # no daemon there, and MODELD_NO_AUTOSTART=1
    try:
        out = lonely.run("run", str(tiny_model), "hi there")
        assert out.returncode == 3, out.stderr
        assert "modeld serve" in out.stderr
        assert "started the daemon" not in out.stderr
        assert not lonely.socket_path.exists()
        as_json = lonely.run("ps", "--json")
        assert as_json.returncode == 3
        assert json.loads(as_json.stdout)["error"]["code"] == "daemon_unavailable"
    finally:
        lonely.cleanup()


def test_exit_model_not_found_4(cli: CliEnv, tmp_path: Path) -> None:
    missing = cli.run("run", str(tmp_path / "missing.gguf"), "hi there")
    assert missing.returncode == 4, missing.stderr
    assert "missing.gguf" in missing.stderr and missing.stdout == ""
    unknown = cli.run("run", "no-such-model", "hi there", "--json")
    assert unknown.returncode == 4
    assert json.loads(unknown.stdout)["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"this is not a gguf file at all\n" * 20, "gguf"),
        (b"GGUF\x03\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01", "truncated"),
    ],
    ids=["not-gguf", "truncated"],
)
def test_exit_invalid_model_5(cli: CliEnv, tmp_path: Path, content: bytes, needle: str) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    out = cli.run("run", str(bad), "hi there")
    assert out.returncode == 5, (out.returncode, out.stderr)
    assert needle in out.stderr.lower() and out.stdout == ""
    assert cli.run("ps").returncode == 0  # the daemon shrugged it off


def test_exit_insufficient_memory_6(tiny_model: Path) -> None:
    small = CliEnv.create()
    try:
        small.serve("--memory-cap", "1MiB")
        out = small.run("run", str(tiny_model), "hi there", "--max-tokens", "4")
        assert out.returncode == 6, (out.returncode, out.stderr)
        assert "memory" in out.stderr.lower()
        doc = small.run("load", str(tiny_model), "--json")
        assert doc.returncode == 6
        assert json.loads(doc.stdout)["error"]["code"] == "insufficient_memory"
        small.stop_and_check()
    finally:
        small.cleanup()


# ---------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_exits_130_and_daemon_stays_healthy(cli: CliEnv, tiny_model: Path) -> None:
    before = _stats(cli)["tokens_generated"]
    proc = _start_long_run(cli, tiny_model)
    _first_bytes(proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert b"Traceback" not in err
    until(lambda: _idle_row(cli, tiny_model), timeout=30, what="the model idle after Ctrl-C")
    # The generation was cut short: the first bytes came while it was still running.
    assert _stats(cli)["tokens_generated"] - before < 2000
    again = cli.run("run", str(tiny_model), "hi there", *GREEDY, "--max-tokens", "4")
    assert again.returncode == 0, again.stderr


# ---------------------------------------------------------------------- text views


def test_ps_text_fits_80_columns(cli: CliEnv, tiny_model: Path) -> None:
    cli.json("load", str(tiny_model))
    out = cli.run("ps")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == [
        "MODEL",
        "MODE",
        "STATE",
        "MEM",
        "meas/est",
        "CTX",
        "REQ",
        "UNTIL",
        "USED",
    ]
    assert all(len(line) <= 80 for line in lines), out.stdout
    row = next(line for line in lines if line.startswith(tiny_model.stem))
    # CTX is n_ctx, or n_ctx x the sequences decoded together (automatic parallel: 4)
    ctx_cell = r"\d+(x\d+)?"
    assert re.search(
        rf"\bgen\s+ready\s+[\d.]+/[\d.]+ MiB\s+{ctx_cell}\s+0/0\s+\S+\s+\d+[smhd] ago$", row
    )
    verbose = cli.run("ps", "-v")
    assert "context:" in verbose.stdout and "runner pid:" in verbose.stdout
    narrow = cli.run("ps", env_extra={"COLUMNS": "40"})
    assert tiny_model.stem not in narrow.stdout  # the name folds instead of the values


def test_stats_text_summarises_nested_values(cli: CliEnv) -> None:
    out = cli.run("stats")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "{" not in text and "[" not in text, text
    assert re.search(r"evictions\s+(none|\w+ \d+)", text)
    assert re.search(r"estimate error mean\s+[+-]\d+\.\d% \(\d+ loads\)", text)


# ---------------------------------------------------------------------- autostart


def test_autostart_starts_a_daemon_and_says_so(tiny_model: Path) -> None:
    fresh = CliEnv.create(autostart=True)
    try:
        off = fresh.run("run", str(tiny_model), "hi there", env_extra={"MODELD_NO_AUTOSTART": "1"})
        assert off.returncode == 3 and not fresh.socket_path.exists()
        out = fresh.run("run", str(tiny_model), "hi there", *GREEDY, "--max-tokens", "4")
        assert out.returncode == 0, out.stderr
        match = re.search(r"started the daemon in the background \(pid (\d+)", out.stderr)
        assert match, out.stderr
        pid = int(match.group(1))
        fresh.extra_cleanup.append(pid)
        assert pid_alive(pid) and fresh.socket_path.exists()
        assert fresh.ps_row(tiny_model) is not None  # the model stayed loaded in it
        second = fresh.run("run", str(tiny_model), "hi there", *GREEDY, "--max-tokens", "4")
        assert second.returncode == 0 and "started the daemon" not in second.stderr
        assert second.stdout == out.stdout
        stopped = fresh.json("stop")
        assert stopped["kind"] == "stop" and stopped["stopped"] is True
        until(lambda: not pid_alive(pid), timeout=30, what="the autostarted daemon to exit")
        assert not fresh.socket_path.exists()
    finally:
        fresh.cleanup()


def test_exit_context_exceeded_9(cli: CliEnv, tiny_model: Path) -> None:
    long_prompt = "word " * 3000  # the tiny model is trained for 2048 tokens
    out = cli.run("run", str(tiny_model), long_prompt, "--raw", "--max-tokens", "4")
    assert out.returncode == 9, (out.returncode, out.stderr)
    assert "tokens" in out.stderr and out.stdout == ""
    assert cli.run("ps").returncode == 0  # the daemon keeps serving

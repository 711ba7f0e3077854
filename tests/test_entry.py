"""The console script's fast path (modeld.cli.entry): same answers as the full CLI, fewer imports.

Everything runs the real ``modeld`` console script in subprocesses against a real daemon; the
fast path is compared with the full Typer path (``MODELD_NO_FAST=1``) on the same daemon.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from modeld import __version__
from modeld.cli import entry, fastwire
from modeld.cli._help import HELP

MODELD = str(Path(sys.executable).parent / "modeld")


def _run(args: list[str], env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MODELD, *args], env={**env, **extra}, capture_output=True, text=True, timeout=60,
        check=False,
    )


def test_prerendered_help_is_fresh() -> None:
    """If this fails, run: python -m modeld.cli.entry --write-help"""
    assert entry.render_help() == HELP


def test_help_and_version_match_the_full_cli(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "100", "MODELD_CONFIG": str(tmp_path / "none.toml")}
    fast_help, full_help = _run(["--help"], env), _run(["--help"], env, MODELD_NO_FAST="1")
    assert fast_help.returncode == full_help.returncode == 0
    assert fast_help.stdout == full_help.stdout == HELP
    assert _run(["--version"], env).stdout == f"modeld {__version__}\n"
    assert _run(["-h"], env).stdout == HELP


def test_narrow_terminal_help_goes_to_typer(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "60"}
    fast, full = _run(["--help"], env), _run(["--help"], env, MODELD_NO_FAST="1")
    assert fast.stdout == full.stdout
    assert fast.stdout != HELP  # wrapped at 60 columns by click itself


def _load_tiny(handle: Any, tiny_model: Path) -> None:
    c = handle.client()
    c.load(str(tiny_model))


def _stable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    volatile = {"keep_alive_left_s", "last_used"}
    return [{k: v for k, v in r.items() if k not in volatile} for r in rows]


def test_ps_matches_full_cli(daemon_factory: Callable[..., Any], tiny_model: Path) -> None:
    handle = daemon_factory("--no-spare")
    env = dict(handle.env, COLUMNS="120")
    empty_fast, empty_full = _run(["ps"], env), _run(["ps"], env, MODELD_NO_FAST="1")
    assert empty_fast.returncode == empty_full.returncode == 0
    assert empty_fast.stdout == empty_full.stdout == "no models loaded\n"
    _load_tiny(handle, tiny_model)
    docs = {
        name: _run(["ps", "--json"], env, **extra)
        for name, extra in {
            "ctypes": {},
            "pyzmq": {"MODELD_FAST_TRANSPORT": "pyzmq"},
            "full": {"MODELD_NO_FAST": "1"},
        }.items()
    }
    parsed = {}
    for name, proc in docs.items():
        assert proc.returncode == 0, (name, proc.stderr)
        parsed[name] = json.loads(proc.stdout)
    assert {d["kind"] for d in parsed.values()} == {"ps"}
    assert {d["schema_version"] for d in parsed.values()} == {1}
    rows = {name: _stable(d["models"]) for name, d in parsed.items()}
    assert rows["ctypes"] == rows["pyzmq"] == rows["full"]
    assert rows["full"][0]["path"] == str(tiny_model.resolve())
    text = _run(["ps"], env)
    assert text.returncode == 0
    assert text.stdout.splitlines()[0].split()[:3] == ["MODEL", "MODE", "STATE"]
    assert tiny_model.stem in text.stdout


def test_no_daemon_falls_through_to_the_full_error(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "MODELD_SOCKET": f"ipc://{tmp_path}/none.sock",
        "MODELD_CONFIG": str(tmp_path / "none.toml"),
        "MODELD_NO_AUTOSTART": "1",
    }
    fast, full = _run(["ps"], env), _run(["ps"], env, MODELD_NO_FAST="1")
    assert fast.returncode == full.returncode != 0
    assert fast.stderr == full.stderr and "daemon" in fast.stderr


def test_endpoint_follows_env_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "config.toml"
    monkeypatch.setenv("MODELD_CONFIG", str(cfg))
    monkeypatch.setenv("MODELD_SOCKET", f"ipc://{tmp_path}/a.sock")
    assert fastwire._endpoint() == f"ipc://{tmp_path}/a.sock"
    monkeypatch.delenv("MODELD_SOCKET")
    with pytest.raises(fastwire._Fallthrough):  # explicit config file missing: full CLI errors
        fastwire._endpoint()
    cfg.write_text('keep_alive = "10m"\n')
    monkeypatch.setenv("MODELD_RUNTIME_DIR", str(tmp_path / "run"))
    assert fastwire._endpoint() == f"ipc://{tmp_path / 'run' / 'modeld.sock'}"
    cfg.write_text('socket = "ipc:///elsewhere.sock"\n')
    with pytest.raises(fastwire._Fallthrough):  # the full CLI parses and validates it
        fastwire._endpoint()
    cfg.write_text("not toml [\n")
    with pytest.raises(fastwire._Fallthrough):
        fastwire._endpoint()


def test_fast_path_imports_neither_typer_nor_pyzmq(
    daemon_factory: Callable[..., Any], tiny_model: Path
) -> None:
    """The point of the fast path: ps and --help load no Typer, click, rich or pyzmq."""
    handle = daemon_factory("--no-spare")
    _load_tiny(handle, tiny_model)
    code = (
        "import sys, io\n"
        "from modeld.cli import entry\n"
        "sys.stdout = io.StringIO()\n"
        "assert entry.fast(['ps']) and entry.fast(['--help']) and entry.fast(['--version'])\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('typer', 'click', 'rich', 'zmq', 'json', 'platformdirs') or m == 'modeld.config']\n"
        "sys.__stdout__.write(repr(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=dict(handle.env, COLUMNS="100"), capture_output=True,
        text=True, timeout=60, check=True,
    )
    assert out.stdout == "[]", out.stderr


def _both(args: list[str], env: dict[str, str], stdin: str = "") -> tuple[Any, Any]:
    def go(**extra: str) -> tuple[int, str, str]:
        p = subprocess.run(
            [MODELD, *args], env={**env, **extra}, input=stdin, capture_output=True, text=True,
            timeout=120, check=False,
        )
        return p.returncode, p.stdout, p.stderr

    return go(), go(MODELD_NO_FAST="1")


def test_run_and_load_match_full_cli(
    daemon_factory: Callable[..., Any], tiny_model: Path, tiny_chat_model: Path
) -> None:
    """Same stdout, stderr and exit code as the Typer path, for the forms the fast path takes
    and for those it hands over (one positional argument, --json, an error)."""
    handle = daemon_factory("--no-spare")
    env = dict(handle.env, COLUMNS="120")
    greedy = ["--temperature", "0", "--seed", "1", "--max-tokens", "8"]
    cases: list[tuple[list[str], str]] = [
        (["run", str(tiny_model), "hello there", "--raw", *greedy], ""),
        (["run", str(tiny_chat_model), "hello", "--system", "be brief", *greedy], ""),
        (["run", str(tiny_chat_model), "hi", "--stop=x", "--stop", "y", "--top-k", "5",
          "--top-p=0.9", "--keep-alive", "1m", "--ctx", "512", *greedy], ""),
        (["run", str(tiny_model), "with stdin", "--raw", *greedy], "piped text\n"),
        (["run", str(tiny_model), "json", "--json", *greedy], ""),
        (["run", "/no/such/model.gguf", "hi"], ""),
        (["run", str(tiny_model), "hi", "--max-tokens", "many"], ""),
        (["load", str(tiny_model)], ""),
        (["load", "/no/such/model.gguf"], ""),
    ]
    for args, stdin in cases:
        fast, full = _both(args, env, stdin)
        if "--json" in args:
            f, g = json.loads(fast[1]), json.loads(full[1])
            assert f["text"] == g["text"] and fast[0] == full[0] == 0, args
            continue
        assert fast == full, args
    fast, full = _both(["load", str(tiny_model), "--json"], env)
    rows = [_stable([json.loads(out[1])["model"]]) for out in (fast, full)]
    assert rows[0] == rows[1] and rows[0][0]["state"] == "ready"


def test_run_fast_path_sends_the_same_request(
    daemon_factory: Callable[..., Any], tiny_model: Path
) -> None:
    """The option parsing the fast path does itself: values reach the daemon as typed."""
    handle = daemon_factory("--no-spare")
    env = dict(handle.env)
    args = ["run", str(tiny_model), "count", "--raw", "--temperature", "0", "--max-tokens", "3"]
    fast, full = _both(args, env)
    assert fast[0] == 0 and fast[1] == full[1]
    stats = handle.client().stats()
    assert stats["tokens_generated"] <= 6  # both requests honoured --max-tokens 3


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"XDG_CONFIG_HOME": "/tmp/xdg-config"},
        {"XDG_CONFIG_HOME": "relative/ignored"},
        {"XDG_CONFIG_HOME": ""},
        {"HOME": "/tmp/some-home"},
        {"HOME": "/tmp/some-home", "XDG_CONFIG_HOME": "/tmp/xdg2"},
    ],
)
def test_default_config_file_matches_paths(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path's platformdirs-free rule gives the file modeld.paths would."""
    from modeld import paths

    monkeypatch.delenv("MODELD_CONFIG", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert fastwire._default_config_file() == str(paths.config_file())


@pytest.mark.parametrize(
    "value",
    [
        {"v": 1, "id": "fast-1-2", "type": "ps"},
        {"a": [1, -2.5, 1e-7, 10**30, None, True, False], "b": {"c": "d"}},
        {"messages": [{"role": "user", "content": 'héllo "q" \\ \t\n\u2603 \U0001f600'}]},
        [],
        "",
    ],
)
def test_json_helpers_agree_with_json(value: object) -> None:
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    assert fastwire.dumps(value) == text
    assert fastwire.loads(text.encode()) == json.loads(text)
    assert fastwire.loads(json.dumps(value, indent=2).encode()) == value


@pytest.mark.parametrize("bad", [b'{"x": NaN}', b'{"x": 1} junk', b"", b"{", b"\xff"])
def test_json_loads_refuses_what_json_refuses(bad: bytes) -> None:
    with pytest.raises(ValueError):
        fastwire.loads(bad)
    with pytest.raises(ValueError):
        fastwire.dumps(float("nan"))


@pytest.mark.parametrize(
    "env",
    [
        {"MODELD_SOCKET": "tcp://127.0.0.1:5555"},
        {"MODELD_SOCKET": "ipc:///tmp/x/modeld.sock"},
        {"MODELD_SOCKET": "/tmp//x/./m.sock"},
        {"MODELD_SOCKET": "~/m.sock"},
        {"MODELD_RUNTIME_DIR": "/tmp/rt/"},
        {"MODELD_RUNTIME_DIR": "~/rt"},
        {"MODELD_RUNTIME_DIR": "/tmp/a/../b"},
        {"XDG_RUNTIME_DIR": "{tmp}"},
        {"XDG_RUNTIME_DIR": "{tmp}/missing"},
        {},
    ],
)
def test_socket_endpoint_matches_paths(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path's pathlib-free rule names the same socket modeld.paths does."""
    from modeld import paths

    for name in ("MODELD_SOCKET", "MODELD_RUNTIME_DIR", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v.format(tmp=tmp_path))
    fast, slow = fastwire._socket_endpoint(), paths.socket_endpoint()
    if "://" in fast and not fast.startswith("ipc://"):
        assert fast == slow
    else:
        assert os.path.normpath(fast[len("ipc://"):]) == os.path.normpath(slow[len("ipc://"):])


@pytest.mark.parametrize(
    "ref", ["/a/b.gguf", " /a//b/./c.gguf ", "/x/../y.gguf", "rel/m.gguf", "./m.gguf", "name",
            "m.gguf", "~/m.gguf", "default", ""],
)
def test_model_ref_matches_the_full_cli(ref: str) -> None:
    from modeld.cli.app import _model_ref

    assert entry._model_ref(ref) == _model_ref(ref)

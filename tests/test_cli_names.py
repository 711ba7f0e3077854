"""File names a hostile process chose (issue 45, item 7), through the real CLI and daemon:
``modeld list`` and ``modeld ps`` show a name's escape and right-to-left-override characters
escaped, never raw; a hard-linked model (one file, two names) is loaded once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cliutil import GREEDY, CliEnv

EVIL = "evil\x1b[2J\u202etxt.fdp"  # clears the screen, then prints backwards


@pytest.fixture()
def cli() -> Iterator[CliEnv]:
    with CliEnv.served() as env:
        yield env


def test_list_and_ps_escape_control_and_bidi_characters(cli: CliEnv, tiny_model: Path) -> None:
    evil = cli.root / "models" / f"{EVIL}.gguf"
    evil.write_bytes(tiny_model.read_bytes())
    listed = cli.run("list", env_extra={"COLUMNS": "400"})  # one line a row
    assert listed.returncode == 0, listed.stderr
    assert "\x1b" not in listed.stdout and "\u202e" not in listed.stdout
    assert "evil\\x1b[2J\\u202etxt.fdp" in listed.stdout
    assert cli.json("list")["models"][0]["name"] == EVIL  # JSON keeps the name as it is
    ran = cli.run("run", EVIL, "hi", "--max-tokens", "2", *GREEDY)
    assert ran.returncode == 0, ran.stderr
    ps = cli.run("ps", env_extra={"COLUMNS": "400"})
    assert ps.returncode == 0 and "\x1b" not in ps.stdout and "\u202e" not in ps.stdout
    assert "evil\\x1b[2J" in ps.stdout


def test_a_hard_linked_model_loads_once(cli: CliEnv, tiny_model: Path) -> None:
    first = cli.root / "models" / "one.gguf"
    first.write_bytes(tiny_model.read_bytes())
    os.link(first, cli.root / "models" / "other.gguf")
    for name in ("one", "other", "one"):
        ran = cli.run("run", name, "hi", "--max-tokens", "2", *GREEDY)
        assert ran.returncode == 0, ran.stderr
    rows = cli.json("ps")["models"]
    assert len(rows) == 1, rows
    assert cli.json("stats")["loads"] == 1

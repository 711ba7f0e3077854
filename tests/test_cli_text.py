"""The CLI refuses text with no UTF-8 form where it reads it (issue 21, item 1): a prompt file
on stdin in another encoding, or an argument in one, is exit 2 with the offset, not a traceback
and not mojibake sent to a model."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from cliutil import MODELD, CliEnv


@pytest.fixture()
def cli() -> Iterator[CliEnv]:
    env = CliEnv.create()
    yield env
    env.cleanup()


@pytest.mark.parametrize("fast", ["", "1"])
def test_stdin_that_is_not_utf8(cli: CliEnv, fast: str) -> None:
    env = dict(cli.env, MODELD_NO_FAST=fast) if fast else cli.env
    out = subprocess.run([MODELD, "run", "default", "Summarise:"], input=b"caf\xe9 au lait\n",
                         capture_output=True, env=env, timeout=60)
    err = out.stderr.decode()
    assert out.returncode == 2, (out.returncode, err)
    assert "stdin is not valid UTF-8" in err and "offset 3" in err and "Traceback" not in err


def test_an_argument_that_is_not_utf8(cli: CliEnv) -> None:
    out = subprocess.run([os.fsencode(MODELD), b"run", b"default", b"caf\xe9"],
                         stdin=subprocess.DEVNULL, capture_output=True, env=cli.env, timeout=60)
    err = out.stderr.decode()
    assert out.returncode == 2, (out.returncode, err)
    assert "the prompt argument is not valid UTF-8" in err and "Traceback" not in err


@pytest.mark.parametrize(("word", "code"), [("Summarise:", 3), ("Why?", 3), ("hello", 4),
                                            ("qwen:7b", 4), ("my-model.v2", 4)])
def test_one_argument_is_a_prompt_only_when_it_cannot_be_a_name(
    cli: CliEnv, word: str, code: int
) -> None:
    """Item 8: ``cat notes.txt | modeld run "Summarise:"`` sends a prompt (no daemon here:
    exit 3, not 4); a word that could name a model is still an unknown model (exit 4)."""
    out = cli.run("run", word, input="some notes\n")
    assert out.returncode == code, (word, out.returncode, out.stderr)

"""``modeld run MODEL PROMPT --image FILE`` (repeatable) and ``--mmproj`` on run and load,
through a real daemon (issue 38)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import ggufgen
import imageutil
from cliutil import CliEnv

pytestmark = pytest.mark.slow

N_IMAGE = ggufgen.mmproj_tokens(ggufgen.TINY_MMPROJ)
GREEDY = ("--temperature", "0", "--max-tokens", "6")


@pytest.fixture()
def cli() -> Iterator[CliEnv]:
    with CliEnv.served() as env:
        yield env


def test_run_with_images_and_an_explicit_projector(
    cli: CliEnv, model_factory: Callable[..., Path]
) -> None:
    model = model_factory("llama", **ggufgen.VISION_CHAT)  # no mmproj beside it (cache dir)
    proj = model_factory("mmproj", **ggufgen.TINY_MMPROJ)
    a, b = cli.root / "a.png", cli.root / "b.jpg"
    a.write_bytes(imageutil.noise(1))
    b.write_bytes(imageutil.noise(2, fmt="JPEG"))
    refused = cli.run("run", str(model), "what is this?", "--image", str(a), *GREEDY)
    assert refused.returncode != 0 and "cannot see images" in refused.stderr
    plain = cli.json("run", str(model), "what is this?", *GREEDY)
    assert "mmproj" not in cli.json("show", str(model))
    one = cli.json("run", str(model), "what is this?", "--image", str(a), "--mmproj",
                   str(proj), *GREEDY)  # fmt: skip
    shown = cli.json("show", str(model))  # show says what the loaded model sees with
    assert (shown["plan"], shown["mmproj"]) == ("loaded", str(proj)) and shown["mmproj_bytes"]
    two = cli.json("run", str(model), "what is this?", "--image", str(a), "--image", str(b),
                   *GREEDY)  # fmt: skip  (the load's --mmproj holds until the model unloads)
    tokens = [d["done"]["usage"]["prompt_tokens"] for d in (plain, one, two)]
    assert tokens == [tokens[0], tokens[0] + N_IMAGE, tokens[0] + 2 * N_IMAGE]
    missing = cli.run("run", str(model), "hi", "--image", str(cli.root / "nope.png"))
    assert missing.returncode == 2 and "nope.png" in missing.stderr

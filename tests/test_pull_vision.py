"""``modeld pull`` of a vision repository (issue 38): the model and its image projector
(``mmproj``) from the loopback fake hub (tests/fakehub.py), both verified and resumable, the
projector beside the model where the load finds it; a corrupted projector refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import ggufgen
import imageutil
from cliutil import CliEnv
from fakehub import FakeHub, Fault, HubFile
from modeld.errors import ExitCode
from test_pull_cli import lines, models, visible_files

pytestmark = pytest.mark.slow

N_IMAGE = ggufgen.mmproj_tokens(ggufgen.TINY_MMPROJ)
GREEDY = ("--temperature", "0", "--max-tokens", "4")
Q4, Q8, PROJ = "seer-Q4_K_M.gguf", "seer-Q8_0.gguf", "mmproj-F16.gguf"


@pytest.fixture(scope="module")
def pair(model_factory: Callable[..., Path]) -> tuple[bytes, bytes]:
    """A generated tiny vision model and a projector that matches it (their bytes)."""
    model = model_factory("llama", **ggufgen.VISION_CHAT)
    return model.read_bytes(), model_factory("mmproj", **ggufgen.TINY_MMPROJ).read_bytes()


def test_pull_fetches_the_projector_verified_resumed_and_the_pair_sees(
        cli: CliEnv, hub: FakeHub, pair: tuple[bytes, bytes]) -> None:
    model, proj = pair
    hub.add("org/seer-GGUF", {
        Q4: model, Q8: model + b"\0",  # two quantisations share the folder and its projector
        PROJ: HubFile(data=proj, fault=Fault(drop_after=len(proj) // 2)),
        "mmproj-F32.gguf": proj + b"\0", "README.md": b"a vision model",
    })  # fmt: skip
    out = cli.run("pull", "hf.co/org/seer-GGUF", "--json")
    assert out.returncode == 0, out.stderr
    events = lines(out.stdout)
    chosen = next(e for e in events if e["event"] == "chosen")
    assert [f["file"] for f in chosen["files"]] == [Q4, PROJ]
    assert chosen["total"] == len(model) + len(proj)
    assert f"with its image projector {PROJ}" in chosen["message"]
    folder = models(cli) / "org" / "seer-GGUF"
    done = events[-1]
    assert (done["event"], done["path"], done["mmproj"]) == \
        ("success", str(folder / Q4), str(folder / PROJ))
    # verified by the hub's SHA-256, and resumed after the dropped connection
    sha = hub.file("org/seer-GGUF", PROJ).sha256
    assert chosen["files"][1]["digest"] == f"sha256:{sha}"
    assert hub.downloads("org/seer-GGUF", PROJ) == [None, f"bytes={len(proj) // 2}-"]
    assert hub.sent_bytes("org/seer-GGUF", PROJ) == len(proj)
    assert (folder / Q4).read_bytes() == model and (folder / PROJ).read_bytes() == proj
    assert visible_files(cli) == [f"org/seer-GGUF/{PROJ}", f"org/seer-GGUF/{Q4}"]
    # a projector is not a model: list shows the model alone
    listed = [m["name"] for m in cli.json("list")["models"] if m["source"] == "models_dir"]
    assert listed == ["seer-Q4_K_M"]
    # the pair loads with vision: show names the projector, an image adds its tokens
    assert cli.json("show", "org/seer-GGUF:Q4_K_M")["mmproj"] == str(folder / PROJ)
    image = cli.root / "a.png"
    image.write_bytes(imageutil.noise(1))
    cli.serve()
    try:
        plain = cli.json("run", "org/seer-GGUF:Q4_K_M", "what is this?", *GREEDY)
        seen = cli.json("run", "org/seer-GGUF:Q4_K_M", "what is this?", "--image", str(image),
                        *GREEDY)  # fmt: skip
        assert seen["done"]["usage"]["prompt_tokens"] == \
            plain["done"]["usage"]["prompt_tokens"] + N_IMAGE
    finally:
        cli.stop_and_check()
    # another quantisation: the projector already here is not fetched again, and the record
    # of each model names it (the folder holds two models now)
    out = cli.run("pull", "org/seer-GGUF:Q8_0", "--json")
    assert out.returncode == 0, out.stderr
    proj_done = [e for e in lines(out.stdout) if e["event"] == "file_done" and e["file"] == PROJ]
    assert proj_done[0]["present"] is True
    assert hub.sent_bytes("org/seer-GGUF", PROJ) == len(proj)
    for quant in ("Q4_K_M", "Q8_0"):
        assert cli.json("show", f"org/seer-GGUF:{quant}")["mmproj"] == str(folder / PROJ)
    # rm of one quantisation keeps the projector the other needs; the last one takes it along
    assert cli.json("rm", "org/seer-GGUF:Q8_0")["removed"] == [str(folder / Q8)]
    assert cli.json("rm", "org/seer-GGUF:Q4_K_M")["removed"] == \
        [str(folder / Q4), str(folder / PROJ)]
    assert not (models(cli) / "org").exists()


def test_a_corrupted_projector_is_refused_and_a_second_pull_completes_the_pair(
        cli: CliEnv, hub: FakeHub, pair: tuple[bytes, bytes]) -> None:
    model, proj = pair
    hub.add("org/seer-GGUF", {Q4: model,
                              PROJ: HubFile(data=proj, fault=Fault(flip_byte_at=100))})
    out = cli.run("pull", "org/seer-GGUF", "--json")
    assert out.returncode == ExitCode.VERIFICATION_FAILED, out.stderr
    err = json.loads(out.stdout[out.stdout.index("{\n"):])["error"]
    assert (err["code"], err["details"]["file"]) == ("verification_failed", PROJ)
    # the verified model stays; nothing of the projector is visible or left to resume
    assert visible_files(cli) == [f"org/seer-GGUF/{Q4}"]
    assert not list(models(cli).rglob("*.part"))
    assert "mmproj" not in cli.json("show", "org/seer-GGUF:Q4_K_M")
    hub.file("org/seer-GGUF", PROJ).fault.flip_byte_at = None
    out = cli.run("pull", "org/seer-GGUF")
    assert out.returncode == 0, out.stderr
    folder = models(cli) / "org" / "seer-GGUF"
    assert out.stdout.endswith(f"{folder / Q4}\nwith its image projector: {folder / PROJ}\n")
    assert (folder / PROJ).read_bytes() == proj
    assert cli.run("pull", "org/seer-GGUF", "--quiet").stdout == f"{folder / Q4}\n"
    assert cli.json("show", "org/seer-GGUF:Q4_K_M")["mmproj"] == str(folder / PROJ)

"""The README's "Getting models" examples, replayed line by line through a shell against a
loopback fake hub that serves generated GGUFs under the names the README uses."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from cliutil import MODELD, CliEnv
from fakehub import FakeHub

README = Path(__file__).resolve().parent.parent / "README.md"
REPO = "unsloth/gemma-3-270m-it-GGUF"


def getting_models_examples() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Getting models"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the Getting models section has no sh example block"
    lines = []
    for line in block.group(1).splitlines():
        command = re.sub(r"\s{2,}# .*$", "", line).strip()  # a trailing comment
        if command:
            lines.append(command)
    return lines


def test_the_examples_name_pull_run_and_rm() -> None:
    lines = getting_models_examples()
    assert len(lines) >= 6
    assert {"pull", "run", "rm"} <= {w for line in lines for w in line.split()}


@pytest.mark.slow
def test_getting_models_examples_replay_against_a_fake_hub(tiny_model: Path) -> None:
    data = tiny_model.read_bytes()
    names = [f"gemma-3-270m-it-{q}.gguf" for q in ("Q4_K_M", "Q6_K", "Q8_0", "F16")]
    with FakeHub() as hub:
        hub.add(REPO, dict.fromkeys(names, data))
        cli = CliEnv.create()
        try:
            cli.env.update(HF_ENDPOINT=hub.url, HF_HOME=str(cli.root / "hf"),
                           PATH=f"{Path(MODELD).parent}{os.pathsep}{cli.env['PATH']}")
            cli.serve()
            for line in getting_models_examples():
                out = subprocess.run(["sh", "-ec", line], env=cli.env, cwd=cli.root,
                                     capture_output=True, text=True, timeout=120,
                                     stdin=subprocess.DEVNULL)  # fmt: skip
                assert out.returncode == 0, (line, out.returncode, out.stderr)
            pulled = sorted(p.name for p in (cli.root / "models" / "unsloth").rglob("*.gguf"))
            assert pulled == sorted(n for n in names if "F16" not in n)  # the last line rm'd it
            cli.stop_and_check()
        finally:
            cli.cleanup()

"""Context checkpoints in the runner's prompt state (issue 47), in-process with real llama.cpp
(tests/checkpoint_probe.py, in a subprocess so a native abort fails a test, not pytest): a
prompt that branches back past a sliding window's live cells restores the nearest checkpoint at
or before the branch point instead of starting over; a greedy request does not (a restored
window is not bitwise a fresh one on every model) and keeps its fresh evaluation's logits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

PROBE = Path(__file__).with_name("checkpoint_probe.py")


def probe(path: Path, n_first: int, shared: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(PROBE), str(path), str(n_first), str(shared)],
                         capture_output=True, text=True, timeout=300, cwd=PROBE.parent)
    assert out.returncode == 0, out.stderr[-4000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_a_branch_past_the_window_restores_a_checkpoint(swa_model: Path) -> None:
    # 1,500 tokens through a 64-token window (its cells a ring of 768), branching at 300
    result = probe(swa_model, 1500, 300)
    assert result["n_swa"] == 64
    sampled, greedy = result["sampled"], result["greedy"]
    # one every aligned piece past the window, and one at the prompt's end
    assert sampled["checkpoints"][:3] == [128, 256, 384] and sampled["checkpoints"][-1] == 1501
    assert sampled["source"] == "checkpoint" and sampled["reused"] == 256  # >= 300 - 64
    assert sampled["checkpoint_bytes"] > 0
    # the same split from 256 on as a fresh evaluation: the same first logits here
    assert sampled["argmax_equal"]
    # greedy: no checkpoint restored; its logits are a fresh evaluation's, bitwise
    assert greedy["source"] != "checkpoint" and greedy["logits_equal"], greedy

"""Bitwise checks of the runner's prompt evaluation (modeld.runner.generation) with real llama.cpp.

Run in a subprocess (tests/generation_probe.py) so a native abort fails a test, not pytest. A
greedy request's logits (the prompt's and those of the next decodes) must be identical whether
the prompt was evaluated fresh, after other prompts, after a sampled request, or restored from
the prompt cache (exact and prefix hits).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PROBE = Path(__file__).with_name("generation_probe.py")
SCENARIOS = ("after_other", "after_near", "after_self", "after_sampled_self",
             "after_sampled_near", "exact_hit", "prefix_hit", "after_sampled_snapshot")  # fmt: skip


def probe(path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(PROBE), str(path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def assert_identical(result: dict[str, Any]) -> None:
    for name in SCENARIOS:
        r = result[name]
        assert r["logits_equal"] and r["tokens_equal"], (name, r)


@pytest.mark.slow
def test_default_model_greedy_logits_do_not_depend_on_history(default_model: Path) -> None:
    result = probe(default_model)
    assert_identical(result)
    # the reuse each scenario is designed to exercise really happened
    assert result["after_near"] == {**result["after_near"], "reused": 128, "source": "live"}
    assert result["after_self"]["reused"] == 256
    assert result["exact_hit"]["source"] == "exact" and result["exact_hit"]["reused"] == 294
    assert result["prefix_hit"]["source"] == "snapshot" and result["prefix_hit"]["reused"] == 128
    # a sampled request's snapshot gives its stable prefix, never its logits
    assert result["after_sampled_snapshot"]["source"] == "snapshot"
    # the saved state grows with the cells used (about 18 KiB per token for gemma-3-270m)
    sizes = {int(k): v for k, v in result["state_size_by_tokens"].items()}
    per_token = (sizes[512] - sizes[8]) / (512 - 8)
    assert sizes[8] < 200_000 and 17_000 < per_token < 20_000


@pytest.mark.slow
def test_q8_llama_greedy_logits_do_not_depend_on_history(q8_model: Path) -> None:
    result = probe(q8_model)
    assert_identical(result)
    assert result["exact_hit"]["source"] == "exact"
    assert result["prefix_hit"]["source"] == "snapshot"


@pytest.mark.slow
def test_sliding_window_model_stays_identical(swa_model: Path) -> None:
    """A 64-token window: snapshots of longer prompts leave out old window cells, so greedy
    requests do not restore them (and truncation checks the cells it needs are there)."""
    result = probe(swa_model)
    assert_identical(result)

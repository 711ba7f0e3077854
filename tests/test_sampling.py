"""The top-k shortlist (runner/sampling.py, PromptState.sample) picks what llama.cpp's full
chain picks, on the real Gemma vocabulary (262,144 tokens), run in a subprocess
(tests/sampling_probe.py) so a native abort fails a test, not pytest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from modeld.runner.sampling import SHORTLIST, shortlist_top_k
from modeld.wire.options import Sampling

PROBE = Path(__file__).with_name("sampling_probe.py")


def test_shortlist_only_where_no_logit_moves_before_top_k() -> None:
    assert shortlist_top_k(Sampling(temperature=0.7)) == 40
    assert shortlist_top_k(Sampling(temperature=0.0)) == 0  # greedy: argmax in place
    assert shortlist_top_k(Sampling(temperature=0.7, top_k=0)) == 0  # every token
    assert shortlist_top_k(Sampling(temperature=0.7, top_k=SHORTLIST + 1)) == 0
    assert shortlist_top_k(Sampling(temperature=0.7, repeat_penalty=1.1)) == 0
    assert shortlist_top_k(Sampling(temperature=0.7, frequency_penalty=0.5)) == 0
    assert shortlist_top_k(Sampling(temperature=0.7, presence_penalty=-0.5)) == 0


@pytest.mark.slow
def test_default_model_shortlist_picks_equal_the_full_chain(default_model: Path) -> None:
    out = subprocess.run([sys.executable, str(PROBE), str(default_model)], capture_output=True,
                         text=True, timeout=300, cwd=PROBE.parent)  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result) == 5
    for setting, r in result.items():
        assert r["top_k"] > 0, setting
        assert r["equal"] == r["taken"], (setting, r)  # the same token at every step
        assert r["taken"] >= r["steps"] // 2, (setting, r)  # the shortlist really ran

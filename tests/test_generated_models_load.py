"""Every generated test model loads and generates in real llama-cpp-python, and llama.cpp's
own view of it (vocabulary, context, sliding-window layers) matches what modeld.model.gguf reads.

Each model runs in a child process: a native abort on a bad model must fail one test, not
kill pytest.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from modeld.model.gguf import read_model_info

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, sys
from llama_cpp import Llama

llm = Llama(sys.argv[1], n_ctx=256, n_batch=64, flash_attn=True, swa_full=False,
            verbose=True, seed=7, n_threads=1)
prompt = llm.tokenize(b"hello world")
llm.eval(prompt)
generated = []
for _ in range(4):  # exactly 4 tokens, even if the random weights pick EOS
    tok = llm.sample(temp=0.0)
    generated.append(int(tok))
    llm.eval([tok])
print(json.dumps({
    "n_ctx_train": llm._model.n_ctx_train(), "n_vocab": llm.n_vocab(), "n_embd": llm.n_embd(),
    "n_params": llm._model.n_params(),
    "prompt": prompt, "generated": generated, "n_tokens": llm.n_tokens,
    "text": llm.detokenize(generated).decode("utf-8", "replace"),
}))
"""

IS_SWA = re.compile(r"layer\s+(\d+) assigned to device \w+, is_swa = (\d)")


def check_loads_and_generates(path: Path) -> None:
    info = read_model_info(path)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["n_vocab"] == info.vocab_size
    assert out["n_ctx_train"] == info.context_length
    assert out["n_embd"] == info.embedding_length
    assert out["n_params"] == sum(math.prod(t.shape) for t in info.tensors)
    assert out["prompt"][0] == info.bos_token_id  # add_bos_token is set
    assert len(out["generated"]) == 4
    assert all(0 <= t < info.vocab_size for t in out["generated"])
    assert out["n_tokens"] == len(out["prompt"]) + 4
    # llama.cpp logs which layers use the sliding window; the reader must agree.
    swa = {int(layer): flag == "1" for layer, flag in IS_SWA.findall(proc.stderr)}
    assert tuple(swa[i] for i in range(info.block_count)) == info.sliding_layers


@pytest.mark.parametrize(
    "fixture", ["tiny_model", "tiny_chat_model", "gqa_model", "q8_model", "swa_model"]
)
def test_fixture_models(fixture: str, request: pytest.FixtureRequest) -> None:
    check_loads_and_generates(request.getfixturevalue(fixture))


@pytest.mark.parametrize(
    "params",
    [
        dict(ggufgen.SWA, sliding_window_pattern=3),  # explicit period
        dict(ggufgen.SWA, n_layer=4, sliding_window_pattern=[False, True, True, False]),
        dict(ggufgen.SWA, dtype="q8_0", n_head_kv=2),
    ],
    ids=["period-3", "flags", "q8-gqa"],
)
def test_gemma3_variants(params: dict[str, Any], model_factory: Callable[..., Path]) -> None:
    check_loads_and_generates(model_factory("gemma3", **params))

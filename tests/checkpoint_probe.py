"""Run as a subprocess by test_checkpoints.py: a prompt that branches back past a sliding window
restores a context checkpoint, in-process with real llama.cpp (modeld.runner.generation).

Prints one JSON object: for a sampled (fast) and a greedy (reproducible) branch, the tokens
reused and where from, and whether the first logits rows equal a fresh evaluation's (bitwise,
and the largest difference).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import llama_cpp
import numpy as np

from generation_probe import SoloState, open_model


def main(path: str, n_first: int, shared: int) -> dict[str, Any]:
    llm, words, bos = open_model(path, 4096, 120)
    n_vocab = llm.n_vocab()
    first = bos + words[:n_first]
    branch = first[:shared] + words[n_first + 100:n_first + 400]

    def row(state: SoloState) -> Any:
        if state._pending is not None:
            return np.frombuffer(state._pending, dtype=np.float32, count=n_vocab).copy()
        ptr = llama_cpp.llama_get_logits_ith(state.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()

    out: dict[str, Any] = {"n_swa": int(llama_cpp.llama_model_n_swa(llm._model.model))}
    for name, greedy in (("sampled", False), ("greedy", True)):
        fresh = SoloState(llm, 0)
        fresh.reset()
        fresh.prepare(branch, greedy)
        want = row(fresh)
        state = SoloState(llm, 256 << 20)
        state.reset()
        state.prepare(first, greedy)
        positions = [c.n for c in state.store.checkpoints(0)]
        got = state.prepare(branch, greedy)
        have = row(state)
        out[name] = {
            "checkpoints": positions,
            "checkpoint_bytes": state.store.checkpoint_bytes,
            "reused": got.reused,
            "source": got.source,
            "shared": shared,
            "logits_equal": bool(np.array_equal(want, have)),
            "max_diff": float(np.max(np.abs(want - have))),
            "argmax_equal": int(np.argmax(want)) == int(np.argmax(have)),
        }
        state.store.clear()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))

"""Run as a subprocess by test_generation.py: bitwise checks of modeld.runner.generation in-process.

Prints one JSON object: for each scenario whether the greedy first logits (and the next tokens)
equal those of a fresh aligned evaluation, plus the tokens reused and where they came from.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import llama_cpp
import numpy as np

from modeld.runner.generation import DecodeBatch, PromptState, Reused
from modeld.runner.promptplan import ALIGN
from modeld.runner.sampling import make_sampler
from modeld.wire.options import Sampling

TEXT = (
    "The history of the river valley is long and full of stories about farmers, traders and "
    "travellers who came from the hills to sell wool, salt and iron at the autumn market. "
)


class SoloState(PromptState):
    """One sequence driven alone, with decode calls of its own: the calls the runner's batch
    makes (begin, evaluated, prompt_done), for one sequence and no other."""

    def _decode(self, start: int, part: list[int]) -> None:
        batch = DecodeBatch(self.llm)
        for i, token in enumerate(part):
            batch.add(token, start + i, self.seq, i == len(part) - 1)
        batch.decode()
        self.evaluated((start, start + len(part)), part, alone=True)

    def prepare(self, prompt: list[int], reproducible: bool) -> Reused:
        prepared, todo = self.begin(prompt, reproducible)
        for start, end in todo:
            self._decode(start, prompt[start:end])
        if todo:
            self.prompt_done(len(prompt))
        return prepared

    def decode(self, token: int) -> None:
        self._decode(len(self.tokens), [token])


def open_model(path: str, n_ctx: int, repeat: int) -> tuple[llama_cpp.Llama, list[int], list[int]]:
    """The model as the runner loads it, :data:`TEXT` ``repeat`` times tokenized, and its BOS."""
    llm = llama_cpp.Llama(
        model_path=path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=2,
        n_threads_batch=2, flash_attn=True, swa_full=False, logits_all=False, verbose=False,
        seed=1,
    )  # fmt: skip
    words = llm.tokenize(TEXT.encode() * repeat, add_bos=False)
    return llm, words, [llm.token_bos()] if llm.token_bos() >= 0 else []


def main(path: str) -> dict[str, Any]:
    llm, words, bos = open_model(path, 1024, 12)
    n_vocab = llm.n_vocab()
    prompt = bos + words[: 2 * ALIGN + 37]  # three aligned pieces, the last one partial
    near = prompt[: ALIGN + 50] + words[300:340]  # shares more than one piece
    other = bos + words[400:430]

    def first(state: SoloState, tokens: list[int], greedy: bool = True) -> tuple[Any, ...]:
        prep = state.prepare(tokens, greedy)
        if state._pending is not None:
            row = np.frombuffer(state._pending, dtype=np.float32, count=n_vocab).copy()
        else:
            ptr = llama_cpp.llama_get_logits_ith(state.ctx, -1)
            row = np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()
        settings = Sampling(temperature=0.0 if greedy else 1.0, top_k=40, top_p=0.95)
        sampler = make_sampler(llm, settings)
        out, rows = [], [row]
        for _ in range(6):
            tok = state.sample(sampler)
            out.append(tok)
            state.decode(tok)
            ptr = llama_cpp.llama_get_logits_ith(state.ctx, -1)
            rows.append(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy())
        return np.stack(rows), out, prep.reused, prep.source

    results: dict[str, Any] = {}
    fresh = SoloState(llm, 0)
    fresh.reset()
    ref, ref_tokens, _, _ = first(fresh, prompt)

    def check(name: str, got: tuple[Any, ...]) -> None:
        row, toks, reused, source = got
        results[name] = {
            "logits_equal": bool(np.array_equal(row, ref)),
            "first_logits_equal": bool(np.array_equal(row[0], ref[0])),
            "tokens_equal": toks == ref_tokens,
            "reused": reused,
            "source": source,
        }

    # No prompt cache: after other prompts (sharing a prefix or not), after itself, after a
    # sampled request.
    plain = SoloState(llm, 0)
    plain.reset()
    for name, before, greedy in (
        ("after_other", other, True), ("after_near", near, True), ("after_self", prompt, True),
        ("after_sampled_self", prompt, False), ("after_sampled_near", near, False),
    ):  # fmt: skip
        first(plain, before, greedy)
        check(name, first(plain, prompt))
    # With the prompt cache: exact hit, and a prefix hit from a snapshot.
    cached = SoloState(llm, 64 << 20)
    cached.reset()
    first(cached, prompt)
    first(cached, other)
    check("exact_hit", first(cached, prompt))
    cached.store.clear()
    first(cached, near)
    first(cached, other)
    check("prefix_hit", first(cached, prompt))
    # The snapshot a sampled request left (fast pieces) is not used for a greedy exact hit.
    cached.store.clear()
    first(cached, prompt, greedy=False)
    first(cached, other)
    check("after_sampled_snapshot", first(cached, prompt))
    results["state_bytes"] = {
        str(len(s.tokens)): s.state_size for s in cached.store.snapshots()
    }
    sizes = {}
    probe = SoloState(llm, 0)
    for n in (8, 64, 128, 256, 512):
        probe.reset()
        probe.prepare((bos + words * 4)[:n], True)
        sizes[n] = int(llama_cpp.llama_state_seq_get_size(probe.ctx, 0))
    results["state_size_by_tokens"] = sizes
    results["n_vocab"] = n_vocab
    return results


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))

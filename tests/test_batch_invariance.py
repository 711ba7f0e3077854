"""Greedy replies batched without changing a token (issue 26), in a real runner process.

A runner loaded with ``parallel`` N decodes its sequences' tokens together; every greedy reply
must equal, byte for byte, the same request sent alone to the same runner, whatever else
decodes beside it: 2, 4, 7 and 8 concurrent sequences, sequences joining and leaving
mid-reply, prompts of different lengths (past 512 KV cells: flash attention's one-query path),
prompt-cache hits. On the real default model (gemma-3-270m Q4_K_M: repacked and tiled K-quant
kernels) and on a generated model of another architecture (llama, Q8_0), both with 2 threads
(a thread count of 1 hides the split of attention among threads).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from modeld.runner import microbatch
from modeld.runner import protocol as rp
from test_runner import Harness
from test_runner_batch import _replies

pytestmark = pytest.mark.slow

TOPICS = ("the history of the lighthouse", "a recipe for bread", "why the sky is blue",
          "the rules of chess", "how bees make honey", "the first railway",
          "a walk in the mountains", "the life of a star")  # fmt: skip


def gemma_prompts() -> list[str]:
    """Eight prompts of different lengths; two of them past 512 tokens."""
    out = []
    for i, topic in enumerate(TOPICS):
        lead = "A note on the archive. " * (110 + 7 * i) if i in (2, 5) else "Context. " * (3 * i)
        out.append(f"{lead}Write a short essay about {topic}. Essay {i}:")
    return out


def _greedy(prompt: str, max_tokens: int) -> dict[str, Any]:
    return dict(prompt=prompt, raw=True, temperature=0.0, max_tokens=max_tokens)


@pytest.fixture()
def runner() -> Iterator[Harness]:
    h = Harness("inv")
    yield h
    h.close()


def _solo(h: Harness, prompts: list[str], max_tokens: int) -> list[str]:
    replies = []
    for i, p in enumerate(prompts):
        text, done = h.generate(f"solo{i}", **_greedy(p, max_tokens))
        assert done["type"] == "done" and done["timings"]["batched_max"] == 1, done
        replies.append(text)
    return replies


def _together(h: Harness, prompts: list[str], max_tokens: list[int], tag: str) -> list[str]:
    """All of ``prompts`` sent at once; their texts, checked to have shared decode steps."""
    rids = [f"{tag}-{i}" for i in range(len(prompts))]
    for rid, p, n in zip(rids, prompts, max_tokens, strict=True):
        h.send(rp.generate(rid, **_greedy(p, n)))
    got = _replies(h, rids)
    for rid in rids:
        assert got[rid][1]["type"] == "done", got[rid][1]
    assert max(got[r][1]["timings"]["batched_max"] for r in rids) > 1
    return [got[r][0] for r in rids]


def test_decode_calls_are_runs_of_at_most_seven() -> None:
    assert microbatch.runs([3, 0, 1, 5, 6]) == [[0, 1], [3], [5, 6]]
    assert microbatch.decode_calls(range(8)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert microbatch.decode_calls(range(7)) == [list(range(7))]
    assert microbatch.decode_calls(range(15)) == [list(range(5)), list(range(5, 10)),
                                                   list(range(10, 15))]  # fmt: skip
    assert microbatch.decode_calls([0, 2, 3]) == [[0], [2, 3]]
    assert microbatch.decode_calls([]) == []
    with pytest.raises(ValueError):
        microbatch.decode_calls([0], 0)


def test_default_model_greedy_replies_equal_solo_at_2_4_7_8(
    runner: Harness, default_model: Path
) -> None:
    loaded = runner.loaded(default_model, n_ctx=1024, parallel=8, n_threads=2,
                           prompt_cache_mib=0)  # fmt: skip
    assert loaded["greedy_batch_invariant"] is True
    prompts = gemma_prompts()
    solo = _solo(runner, prompts, 24)
    assert len(set(solo)) == len(solo)  # a mix-up between sequences shows
    for n in (2, 4, 7, 8):
        # the long prompts are in every group: 512+ KV cells beside short ones
        group = sorted({2, 5, *range(n)})[:n]
        got = _together(runner, [prompts[i] for i in group], [24] * n, f"n{n}")
        assert got == [solo[i] for i in group], n


def test_default_model_joining_leaving_and_cache_hits(runner: Harness, default_model: Path) -> None:
    runner.loaded(default_model, n_ctx=1024, parallel=8, n_threads=2, prompt_cache_mib=64)
    prompts = gemma_prompts()
    lengths = [40, 8, 40, 16, 40, 4]  # the short ones leave while the others stream
    solo = [runner.generate(f"s{i}", **_greedy(p, n))[0]
            for i, (p, n) in enumerate(zip(prompts, lengths, strict=False))]
    # three start; three more join once the first streams, each at another step
    rids = [f"j{i}" for i in range(6)]
    texts: dict[str, list[str]] = {r: [] for r in rids}
    finals: dict[str, dict[str, Any]] = {}
    for i in range(3):
        runner.send(rp.generate(rids[i], **_greedy(prompts[i], lengths[i])))
    joined = 3
    while len(finals) < 6:
        msg = runner.recv()
        rid = msg["rid"]
        if msg["type"] == "chunk":
            texts[rid].append(msg["text"])
            if joined < 6:
                runner.send(rp.generate(rids[joined], **_greedy(prompts[joined],
                                                                 lengths[joined])))  # fmt: skip
                joined += 1
        else:
            assert msg["type"] == "done", msg
            finals[rid] = msg
    assert ["".join(texts[r]) for r in rids] == solo
    assert max(f["timings"]["batched_max"] for f in finals.values()) >= 3
    # prompt-cache hits: the same prompts again (exact hits from the snapshots), beside a new one
    again = _together(runner, [prompts[0], prompts[2], prompts[6]], [40, 40, 24], "hit")
    assert again[:2] == [solo[0], solo[2]]
    assert again[2] == runner.generate("s6", **_greedy(prompts[6], 24))[0]


def test_another_architecture_greedy_replies_equal_solo(
    runner: Harness, model_factory: Any
) -> None:
    """A generated llama (Q8_0 weights: llamafile's tinyBLAS for two rows or more, the dot
    products for one) with prompts past 512 KV cells."""
    model = model_factory("llama", **dict(ggufgen.Q8, context_length=4096))
    runner.loaded(model, n_ctx=1024, parallel=8, n_threads=2, prompt_cache_mib=0)
    words = ("the quick brown fox", "once upon a time", "1 2 3 4", "hello world")
    prompts = [" ".join([words[i % 4]] * (4 + 30 * (i % 3))) + f" {i}" for i in range(8)]
    solo = _solo(runner, prompts, 60)
    for n in (2, 4, 7, 8):
        got = _together(runner, prompts[:n], [60] * n, f"n{n}")
        assert got == solo[:n], n

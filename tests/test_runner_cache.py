"""Reproducible greedy replies and the prompt-state cache, through a real runner process.

Greedy replies used to depend on the previous request (llama.cpp's CPU logits depend on how a
prompt is split into batches, and the split followed the longest common prefix with whatever
ran before): "A recipe for bread" after itself and after another prompt gave different text
with the default model. See modeld.runner.promptplan.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modeld.runner.promptplan import ALIGN
from test_runner import Harness

PROMPTS = ("The history of the lighthouse", "A recipe for bread", "Why the sky is blue",
           "Notes on the migration of birds")  # fmt: skip
GREEDY: dict[str, Any] = dict(raw=True, max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def runner() -> Iterator[Harness]:
    h = Harness("pc")
    yield h
    h.close()


def _replies_after_each_other(h: Harness) -> dict[str, set[str]]:
    replies: dict[str, set[str]] = {p: set() for p in PROMPTS}
    n = 0
    for before in PROMPTS:
        for prompt in PROMPTS:
            h.generate(f"b{n}", prompt=before, **GREEDY)
            text, done = h.generate(f"p{n}", prompt=prompt, **GREEDY)
            assert done["type"] == "done", done
            replies[prompt].add(text)
            n += 1
    return replies


@pytest.mark.slow
@pytest.mark.parametrize("cache_mib", [0, 32])
def test_greedy_reply_does_not_depend_on_the_previous_request(
    runner: Harness, default_model: Path, cache_mib: int
) -> None:
    runner.loaded(default_model, n_ctx=1024, prompt_cache_mib=cache_mib)
    replies = _replies_after_each_other(runner)
    assert all(len(texts) == 1 for texts in replies.values()), replies


@pytest.mark.slow
def test_exact_hit_and_prefix_hit_give_the_fresh_reply(
    runner: Harness, default_model: Path
) -> None:
    shared = " ".join(f"item {i} is a small stone." for i in range(40))
    prompt = f"{shared}\nQuestion: which item is last?"
    near = f"{shared}\nQuestion: which item is first?"
    runner.loaded(default_model, n_ctx=1024, prompt_cache_mib=0)
    fresh, first = runner.generate("f1", prompt=prompt, **GREEDY)
    n = first["usage"]["prompt_tokens"]
    assert n > 2 * ALIGN and first["usage"]["prompt_tokens_reused"] == 0

    runner.loaded(default_model, n_ctx=1024, prompt_cache_mib=32)
    runner.generate("c1", prompt=near, **GREEDY)  # snapshot of the shared prefix
    runner.generate("c2", prompt=PROMPTS[0], **GREEDY)  # the live KV shares nothing
    text, prefix_hit = runner.generate("c3", prompt=prompt, **GREEDY)
    reused = prefix_hit["usage"]["prompt_tokens_reused"]
    assert reused > 0 and reused % ALIGN == 0 and reused <= ALIGN * ((n - 1) // ALIGN)
    assert text == fresh
    runner.generate("c4", prompt=PROMPTS[1], **GREEDY)
    text, exact = runner.generate("c5", prompt=prompt, **GREEDY)
    assert exact["usage"]["prompt_tokens_reused"] == n
    assert text == fresh


@pytest.mark.slow
def test_sampled_requests_use_any_exact_snapshot(runner: Harness, default_model: Path) -> None:
    runner.loaded(default_model, n_ctx=1024, prompt_cache_mib=32)
    opts: dict[str, Any] = dict(raw=True, max_tokens=8, temperature=0.9, seed=5)
    a, first = runner.generate("s1", prompt=PROMPTS[2], **opts)
    runner.generate("s2", prompt=PROMPTS[3], **opts)
    b, again = runner.generate("s3", prompt=PROMPTS[2], **opts)
    assert again["usage"]["prompt_tokens_reused"] == first["usage"]["prompt_tokens"]
    assert a == b  # same seed, same logits


@pytest.mark.slow
def test_the_store_keeps_to_its_budget(runner: Harness, default_model: Path) -> None:
    # A gemma-3-270m snapshot is a 1 MiB logits row plus ~18 KiB per token: 1 MiB holds none,
    # 3 MiB holds two.
    runner.loaded(default_model, n_ctx=1024, prompt_cache_mib=1)
    runner.generate("m1", prompt=PROMPTS[0], **GREEDY)
    runner.generate("m2", prompt=PROMPTS[1], **GREEDY)
    _, done = runner.generate("m3", prompt=PROMPTS[0], **GREEDY)
    assert done["usage"]["prompt_tokens_reused"] == 0
    runner.loaded(default_model, n_ctx=1024, prompt_cache_mib=3)
    for i, prompt in enumerate(PROMPTS[:3]):
        runner.generate(f"n{i}", prompt=prompt, **GREEDY)
    _, newest = runner.generate("n3", prompt=PROMPTS[2], **GREEDY)
    _, middle = runner.generate("n4", prompt=PROMPTS[1], **GREEDY)
    _, oldest = runner.generate("n5", prompt=PROMPTS[0], **GREEDY)
    assert newest["usage"]["prompt_tokens_reused"] == newest["usage"]["prompt_tokens"]
    assert middle["usage"]["prompt_tokens_reused"] == middle["usage"]["prompt_tokens"]
    assert oldest["usage"]["prompt_tokens_reused"] == 0  # evicted (least recently used)


def test_snapshots_survive_the_models_eviction(
    runner: Harness, tiny_model: Path, gqa_model: Path, tmp_path: Path
) -> None:
    """Closing a model writes its snapshots to the prompt cache dir; loading it again (here in
    the same runner after another model) reads them back, and the reply is unchanged."""
    cache = tmp_path / "prompts"
    prompt = "the quick brown fox jumps over the lazy dog " * 3
    runner.loaded(tiny_model, prompt_cache_dir=str(cache))
    first, done = runner.generate("e1", prompt=prompt, **GREEDY)
    assert done["usage"]["prompt_tokens_reused"] == 0
    runner.loaded(gqa_model, prompt_cache_dir=str(cache))  # replaces: tiny's snapshots saved
    (saved,) = cache.glob("*.bin")
    written = saved.stat()
    runner.loaded(tiny_model, prompt_cache_dir=str(cache))
    again, done = runner.generate("e2", prompt=prompt, **GREEDY)
    assert again == first
    assert done["usage"]["prompt_tokens_reused"] == done["usage"]["prompt_tokens"]
    # another context size is another identity: nothing to restore, no wrong reuse
    runner.loaded(tiny_model, n_ctx=256, prompt_cache_dir=str(cache))
    # the replaced model's snapshots were those read back: its file is kept, not rewritten
    assert saved.stat().st_ino == written.st_ino and saved.stat().st_size == written.st_size
    _, done = runner.generate("e3", prompt=prompt, **GREEDY)
    assert done["usage"]["prompt_tokens_reused"] == 0
    # a damaged file is ignored (and removed), not an error
    for f in cache.glob("*.bin"):
        f.write_bytes(f.read_bytes()[:100])
    runner.loaded(tiny_model, prompt_cache_dir=str(cache))
    text, done = runner.generate("e4", prompt=prompt, **GREEDY)
    assert done["type"] == "done" and text == first


@pytest.mark.slow
def test_a_greedy_chat_turn_keeps_the_whole_previous_prompt(
    runner: Harness, tiny_chat_model: Path
) -> None:
    """A chat's reply starts a piece of its own (promptplan.turn_marks), so the next greedy
    turn reuses the previous prompt whole, not only up to a multiple of ALIGN, and its reply
    is still the fresh evaluation's."""
    question = " ".join(f"stone {i}" for i in range(20))  # a prompt past one aligned piece
    turn1 = [{"role": "user", "content": question}]
    chat: dict[str, Any] = dict(max_tokens=6, temperature=0.0)
    runner.loaded(tiny_chat_model, n_ctx=1024, prompt_cache_mib=0)
    reply, first = runner.generate("t1", messages=turn1, **chat)
    n1 = first["usage"]["prompt_tokens"]
    assert n1 > ALIGN and n1 % ALIGN, n1  # the old rule would keep only a multiple of ALIGN
    turn2 = [*turn1, {"role": "assistant", "content": reply},
             {"role": "user", "content": "and the last?"}]  # fmt: skip
    text, second = runner.generate("t2", messages=turn2, **chat)
    assert second["usage"]["prompt_tokens_reused"] == n1
    runner.loaded(tiny_chat_model, n_ctx=1024, prompt_cache_mib=0)  # nothing cached
    fresh, alone = runner.generate("t3", messages=turn2, **chat)
    assert alone["usage"]["prompt_tokens_reused"] == 0 and text == fresh

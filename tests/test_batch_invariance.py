"""Greedy replies batched without changing a token (issue 26), in a real runner process.

A runner loaded with ``parallel`` N decodes its sequences' tokens together; every greedy reply
must equal, byte for byte, the same request sent alone to the same runner, whatever else
decodes beside it: 2, 4, 7 and 8 concurrent sequences, sequences joining and leaving
mid-reply, prompts of different lengths (past 512 KV cells: flash attention's one-query path),
prompt-cache hits. On the real default model (gemma-3-270m Q4_K_M: repacked and tiled K-quant
kernels) and on a generated model of another architecture (llama, Q8_0), both with 2 threads
(a thread count of 1 hides the split of attention among threads).

Each reply is compared with its log-probabilities (the chosen token's and the 3 best, from the
logits row it was picked from): a difference in the last bit of a logit shows even where it
does not change the token.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from daemonutil import rows
from modeld.runner import microbatch
from modeld.wire import runnerwire as rp
from test_runner import Harness

pytestmark = pytest.mark.slow

TOPICS = ("the history of the lighthouse", "a recipe for bread", "why the sky is blue",
          "the rules of chess", "how bees make honey", "the first railway",
          "a walk in the mountains", "the life of a star")  # fmt: skip


def gemma_prompts() -> list[str]:
    """Eight prompts of different lengths: two past 512 tokens (a lone one is padded: its KV
    view is 512+ cells), one of 116 that crosses microbatch.PAD_FROM while it decodes."""
    out = []
    for i, topic in enumerate(TOPICS):
        lead = "A note on the archive. " * (110 + 7 * i) if i in (2, 5) else "Context. " * (3 * i)
        if i == 7:
            lead = "Context. " * 50
        out.append(f"{lead}Write a short essay about {topic}. Essay {i}:")
    return out


Reply = tuple[str, list[Any]]  # text, log-probability entries


def _greedy(prompt: str, max_tokens: int) -> dict[str, Any]:
    return dict(prompt=prompt, raw=True, temperature=0.0, max_tokens=max_tokens, logprobs=True,
                top_logprobs=3)  # fmt: skip


def _collect(h: Harness, rids: list[str], on_chunk: Any = None) -> dict[str, tuple[Reply, Any]]:
    """Messages of ``rids`` until each has its done: (text, logprobs) and the done."""
    texts: dict[str, list[str]] = {r: [] for r in rids}
    probs: dict[str, list[Any]] = {r: [] for r in rids}
    finals: dict[str, dict[str, Any]] = {}
    while len(finals) < len(rids):
        msg = h.recv()
        rid = msg.get("rid")
        assert rid in texts and rid not in finals, msg
        if msg["type"] == "chunk":
            texts[rid].append(msg["text"])
            probs[rid].extend(msg.get("logprobs", []))
            if on_chunk is not None:
                on_chunk(rid)
        else:
            assert msg["type"] == "done", msg
            finals[rid] = msg
    return {r: (("".join(texts[r]), probs[r]), finals[r]) for r in rids}


@pytest.fixture()
def runner() -> Iterator[Harness]:
    h = Harness("inv")
    yield h
    h.close()


def _solo(h: Harness, prompts: list[str], max_tokens: int | list[int]) -> list[Reply]:
    replies = []
    for i, p in enumerate(prompts):
        n = max_tokens if isinstance(max_tokens, int) else max_tokens[i]
        h.send(rp.generate(f"solo{i}", **_greedy(p, n)))
        reply, done = _collect(h, [f"solo{i}"])[f"solo{i}"]
        assert done["timings"]["batched_max"] == 1, done
        assert len(reply[1]) == done["usage"]["completion_tokens"] > 0
        replies.append(reply)
    return replies


def _together(h: Harness, prompts: list[str], max_tokens: list[int], tag: str,
              batched: int = 2, at_most: int | None = None) -> list[Reply]:
    """All of ``prompts`` sent at once; their replies, checked to have shared decode calls of
    ``batched`` sequences at least (and ``at_most``, when given)."""
    rids = [f"{tag}-{i}" for i in range(len(prompts))]
    for rid, p, n in zip(rids, prompts, max_tokens, strict=True):
        h.send(rp.generate(rid, **_greedy(p, n)))
    got = _collect(h, rids)
    most = max(got[r][1]["timings"]["batched_max"] for r in rids)
    assert most >= batched and (at_most is None or most <= at_most), most
    return [got[r][0] for r in rids]


def test_a_lone_sequence_is_padded_only_where_attention_could_split() -> None:
    assert not microbatch.needs_pad(True, microbatch.PAD_FROM - 1)
    assert microbatch.needs_pad(True, microbatch.PAD_FROM)
    assert not microbatch.needs_pad(False, 4096)
    assert microbatch.PAD_FROM <= 256 // 2  # llama.cpp views 256 cells at least


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
    assert len({text for text, _ in solo}) == len(solo)  # a mix-up between sequences shows
    for n in (2, 4, 7, 8):
        # the long prompts are in every group: 512+ KV cells beside short ones
        group = sorted([2, 5, *(i for i in range(8) if i not in (2, 5))][:n])
        # 8 in one call: the runner turned ggml-cpu's tiled matmul off (runner/llamaopen.py)
        got = _together(runner, [prompts[i] for i in group], [24] * n, f"n{n}",
                        batched=8 if n == 8 else 2)
        assert got == [solo[i] for i in group], n
    runner.send(rp.unload())  # that process would evaluate another model's prompts slower
    reply = runner.recv()
    assert reply["type"] == "unloaded" and reply["reusable"] is False


def test_default_model_joining_leaving_and_cache_hits(runner: Harness, default_model: Path) -> None:
    runner.loaded(default_model, n_ctx=1024, parallel=8, n_threads=2, prompt_cache_mib=64)
    prompts = gemma_prompts()
    lengths = [40, 8, 40, 16, 40, 4]  # the short ones leave while the others stream
    solo = _solo(runner, prompts[:6], lengths)
    # three start; three more join as the first ones stream, each at another step
    rids = [f"j{i}" for i in range(6)]
    for i in range(3):
        runner.send(rp.generate(rids[i], **_greedy(prompts[i], lengths[i])))
    joined = [3]

    def join(_rid: str) -> None:
        if joined[0] < 6:
            i = joined[0]
            runner.send(rp.generate(rids[i], **_greedy(prompts[i], lengths[i])))
            joined[0] += 1

    got = _collect(runner, rids, join)
    assert [got[r][0] for r in rids] == solo
    finals = {r: got[r][1] for r in rids}
    assert max(f["timings"]["batched_max"] for f in finals.values()) >= 3
    # prompt-cache hits: the same prompts again (exact hits from the snapshots), beside a new one
    again = _together(runner, [prompts[0], prompts[2], prompts[6]], [40, 40, 24], "hit")
    assert again[:2] == [solo[0], solo[2]]
    assert again[2] == _solo(runner, [prompts[6]], 24)[0]


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


def test_daemon_batches_default_greedy_requests_with_solo_replies(
    daemon_factory: Any, model_factory: Any
) -> None:
    """Through the daemon: greedy requests (``deterministic`` unset: the promise holds) from 4
    clients share decode steps, and each reply equals the same request on an idle model (the
    text: the runner tests above compare log-probabilities too)."""
    model = model_factory("llama", **dict(ggufgen.Q8, context_length=4096))
    d = daemon_factory("--parallel", "4")
    c = d.client()
    words = ("the quick brown fox", "once upon a time", "1 2 3 4", "hello world")
    prompts = [" ".join([w] * (3 + 20 * i)) for i, w in enumerate(words)]

    def run(client: Any, prompt: str) -> tuple[str, int]:
        gen = client.generate(str(model), prompt, max_tokens=80, temperature=0)
        text = gen.text()
        assert gen.done is not None
        return text, gen.done["timings"]["batched_max"]

    refs = [run(c, p) for p in prompts]
    assert all(batched == 1 for _, batched in refs)
    got: dict[int, tuple[str, int]] = {}
    errors: list[BaseException] = []

    def client_thread(i: int) -> None:
        try:
            with d.client() as own:
                got[i] = run(own, prompts[i])
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    assert [got[i][0] for i in range(4)] == [text for text, _ in refs]
    assert max(got[i][1] for i in range(4)) > 1  # they shared decode steps
    row = rows(c)[model.name]
    assert "run alone" not in (row["parallel_reason"] or "")


def test_seven_rows_a_call_unless_the_tiled_matmul_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from modeld.runner import llamaopen

    monkeypatch.delenv("GGML_CPU_TILED_MM", raising=False)
    assert llamaopen.tiled_matmul_on()
    assert llamaopen.max_rows(8) == microbatch.MAX_ROWS == 7
    # ggml-cpu's own reading of its switch: atoi(value) != 0
    for value, on in (("0", False), ("", False), (" 00", False), ("off", False), ("1", True),
                      (" +2x", True), ("-1", True)):  # fmt: skip
        monkeypatch.setenv("GGML_CPU_TILED_MM", value)
        assert llamaopen.tiled_matmul_on() is on, value
        assert llamaopen.max_rows(8) == (7 if on else 8), value


def test_default_model_four_and_four_with_the_tiled_matmul_kept_on(
    default_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GGML_CPU_TILED_MM=1`` in the runner's environment keeps ggml-cpu's tiled matmul on
    (it is taken for 8 rows or more): 8 sequences decode in two calls of 4 and the replies
    still equal solo ones. The runner may then be reused for another model."""
    monkeypatch.setenv("GGML_CPU_TILED_MM", "1")
    h = Harness("inv-tiled-on")
    try:
        h.loaded(default_model, n_ctx=1024, parallel=8, n_threads=2, prompt_cache_mib=0)
        prompts = gemma_prompts()
        solo = _solo(h, prompts, 16)
        got = _together(h, prompts, [16] * 8, "n8", batched=4, at_most=microbatch.MAX_ROWS)
        assert got == solo
        h.send(rp.unload())
        reply = h.recv()
        assert reply["type"] == "unloaded" and "reusable" not in reply
    finally:
        h.close()

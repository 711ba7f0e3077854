"""The TypedDicts of modeld.wire.replies against what the code really builds.

Why: a TypedDict is only a declaration; mypy checks the code that builds literal dicts, but
rows and bodies assembled from other dicts (the daemon's done body from a runner message, ps
rows) could drift. Each check builds the real thing (runner protocol builders, the daemon's
done body, ps rows of a real scheduler) and compares its keys with the declared ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modeld.daemon.jobs import done_body
from modeld.wire import replies
from modeld.wire import runnerwire as rp
from test_scheduler import MiB, make


def keys_match(value: dict[str, Any], typed: Any) -> None:
    """Every required key present, nothing undeclared."""
    declared = typed.__required_keys__ | typed.__optional_keys__
    assert typed.__required_keys__ <= set(value), typed.__required_keys__ - set(value)
    assert set(value) <= declared, set(value) - declared


def test_runner_messages_have_the_declared_keys() -> None:
    memory = {"rss": 3 * MiB, "anon": MiB, "file": 2 * MiB}
    gen = rp.done_generate("r", finish_reason="stop", prompt_tokens=3, prompt_tokens_reused=1,
                           completion_tokens=5, prompt_eval_s=0.1, generation_s=0.2,
                           batched_max=2, memory=memory)  # fmt: skip
    keys_match(dict(gen), replies.RunnerGenerateDone)
    keys_match(dict(gen["usage"]), replies.Usage)
    keys_match(dict(rp.done_embed("r", [[0.5]], 2, 0.01)), replies.RunnerEmbedDone)
    rerank = rp.done_rerank("r", [0.1, 0.9], 1, 7, 0.02, memory=memory)
    keys_match(dict(rerank), replies.RunnerRerankDone)
    assert rerank["results"] == [{"index": 1, "relevance_score": 0.9}]
    for result in rerank["results"]:
        keys_match(dict(result), replies.RerankResult)
    keys_match(dict(rp.error("r", "cancelled", "stopped")), replies.RunnerError)


def test_runner_lifecycle_messages_have_the_declared_keys() -> None:
    """hello, loaded, memory and unloaded, with and without their optional keys (the runner
    process passes all of them; older callers none)."""
    mem = {"rss": 9 * MiB, "anon": 4 * MiB, "file": 5 * MiB, "gpu": MiB}
    foot = {"rss": 8 * MiB, "anon": 3 * MiB, "file": 5 * MiB}
    hello = rp.hello(123, mem, runner_id="r1", llama_cpp_version="0.3", rpc_supported=True)
    keys_match(dict(hello), replies.RunnerHello)
    assert set(hello) == replies.RunnerHello.__required_keys__ | {
        "runner_id", "llama_cpp_version", "rpc_supported"}  # fmt: skip
    keys_match(dict(hello["baseline"]), replies.RunnerMemory)
    keys_match(dict(rp.hello(123, foot)), replies.RunnerHello)
    common: dict[str, Any] = dict(n_ctx=512, n_ctx_train=2048, load_s=0.5, warmup_s=0.1,
                                  chat_format="gemma", memory=mem, footprint=foot)  # fmt: skip
    device = {"device": "RPC0", "endpoint": "127.0.0.1:50052", "model_bytes": 1,
              "kv_bytes": 2, "compute_bytes": 3, "free_bytes": 4, "total_bytes": 5}  # fmt: skip
    full = rp.loaded(**common, parallel=2, greedy_batch_invariant=False, kv_unified=True,
                     mode="generate",
                     architecture="gemma3", has_chat_template=True, vision=True, devices=[device],
                     layers_offloaded="3/3")  # fmt: skip
    typed = replies.RunnerLoaded
    assert set(full) == typed.__required_keys__ | typed.__optional_keys__  # every key, once
    assert list(full)[-9:] == ["parallel", "greedy_batch_invariant", "kv_unified", "mode",
                               "architecture", "has_chat_template", "vision", "devices",
                               "layers_offloaded"]  # fmt: skip
    keys_match(dict(full["devices"][0]), replies.DeviceShare)
    keys_match(dict(full["memory"]), replies.RunnerMemory)
    keys_match(dict(full["footprint"]), replies.RunnerMemory)
    keys_match(dict(rp.loaded(**common)), replies.RunnerLoaded)
    for reply in (rp.memory_reply(mem, foot), rp.unloaded(mem, foot)):
        keys_match(dict(reply), replies.RunnerMemoryReply)
        keys_match(dict(reply["footprint"]), replies.RunnerMemory)


def test_done_bodies_and_ps_rows_have_the_declared_keys(tiny_model: Path, tmp_path: Path) -> None:
    h = make(max_models=1)
    job = h.submit(tiny_model, "a")
    h.hello("r1")
    h.loaded("r1")
    slot = h.sched.slots[job.key]
    entry = h.cache.get(job.key)
    msg = rp.done_generate(job.runner_rid, finish_reason="length", prompt_tokens=2,
                           prompt_tokens_reused=0, completion_tokens=8, prompt_eval_s=0.01,
                           generation_s=0.1)  # fmt: skip
    body = done_body(slot, job, entry, msg, h.clock())
    keys_match(dict(body), replies.GenerateDone)
    keys_match(dict(body["timings"]), replies.GenerateTimings)
    job.kind = "embed"
    embed = done_body(slot, job, entry, rp.done_embed(job.runner_rid, [[1.0]], 2, 0.01), 0.0)
    keys_match(dict(embed), replies.EmbedDone)
    keys_match(dict(embed["timings"]), replies.PooledTimings)
    job.kind = "rerank"
    rerank = done_body(slot, job, entry, rp.done_rerank(job.runner_rid, [0.2], None, 4, 0.01), 0.0)
    keys_match(dict(rerank), replies.RerankDone)

    (loaded,) = h.sched.ps_rows()
    keys_match(dict(loaded), replies.PsRow)
    assert loaded["in_flight"] == 1 and loaded["runner_id"] == "r1"
    # a second model waits for the busy one: its row has the same keys
    other = tmp_path / "other.gguf"
    other.write_bytes(tiny_model.read_bytes())
    h.submit(other, "b", client=b"client-2")
    rows = {r["state"]: r for r in h.sched.ps_rows()}
    keys_match(dict(rows["waiting"]), replies.PsRow)
    assert rows["waiting"]["queued"] == 1
    keys_match(dict(h.sched.row(job.key)), replies.PsRow)

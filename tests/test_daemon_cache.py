"""The daemon's cache behaviour end to end: LRU under a measured budget, keep-alive, slots,
load de-duplication, in-flight protection, file changes and context growth.

Real daemon, real runners, real llama-cpp-python, tiny generated models.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from daemonutil import loaded_names, rows, until
from modeld.errors import ContextExceededError, InsufficientMemoryError
from modeld.model import memory

pytestmark = pytest.mark.slow

Factory = Callable[..., Any]
LONG = dict(ggufgen.TINY, context_length=32768)


@pytest.fixture(scope="module")
def three_models(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three different tiny models (same shape, different weights)."""
    d = tmp_path_factory.mktemp("three")
    return [
        ggufgen.make_llama_model(d / f"m{i}.gguf", **dict(ggufgen.TINY, seed=i)) for i in (1, 2, 3)
    ]


@pytest.fixture(scope="module")
def long_model(model_factory: Factory) -> Path:
    """The tiny model with a 32k training context: long generations to interrupt."""
    return model_factory("llama", **LONG)


def _accounted(row: dict[str, Any]) -> int:
    return max(int(row["estimate_bytes"]), int(row["measured_bytes"] or 0))


def test_lru_order_under_a_measured_budget(
    daemon_factory: Factory, three_models: list[Path]
) -> None:
    # 1. Measure what each model really takes in this environment.
    probe = daemon_factory()
    c = probe.client()
    for m in three_models:
        c.load(str(m), n_ctx=512)
    sizes = [_accounted(r) for r in rows(c).values()]
    smallest = min(r["measured_bytes"] for r in rows(c).values())
    probe.stop()
    assert len(sizes) == 3
    cap = 2 * max(sizes) + max(sizes) // 4
    assert 3 * smallest > cap, f"models too unequal for this test: {sizes}"

    # 2. A budget that holds two of the three: the least recently used one goes.
    d = daemon_factory("--memory-cap", str(cap), "--eviction", "lru")
    c = d.client()
    a, b, third = three_models
    c.load(str(a), n_ctx=512)
    c.load(str(b), n_ctx=512)
    c.generate(str(a), "touch a", max_tokens=2, n_ctx=512).text()  # a is now more recent than b
    c.load(str(third), n_ctx=512)
    until(
        lambda: loaded_names(c) == {a.name, third.name},
        what="b evicted",
        show=lambda: (c.stats()["evictions"], d.log_text()),
    )
    stats = c.stats()
    assert stats["evictions"]["memory"] == 1
    assert stats["used_bytes"] <= stats["budget_bytes"] == cap
    c.generate(str(b), "b again", max_tokens=2, n_ctx=512).text()  # now a is the LRU one
    until(lambda: loaded_names(c) == {third.name, b.name}, what="a evicted", show=c.ps)
    assert c.stats()["evictions"]["memory"] == 2


def test_keep_alive_expiry_and_zero(daemon_factory: Factory, three_models: list[Path]) -> None:
    d = daemon_factory()
    c = d.client()
    short, zero, default = three_models
    row = c.load(str(short), keep_alive="1s")  # the reply is the entry's ps row
    assert row["keep_alive_s"] == 1.0 and row["keep_alive_left_s"] <= 1.0
    c.generate(str(short), "x", max_tokens=2, keep_alive="1s").text()
    c.generate(str(default), "x", max_tokens=2).text()
    assert rows(c)[default.name]["keep_alive_s"] == 300.0
    c.generate(str(zero), "x", max_tokens=2, keep_alive=0).text()
    until(lambda: zero.name not in loaded_names(c), timeout=5, what="keep_alive 0 unload")
    until(lambda: short.name not in loaded_names(c), timeout=10, what="1s keep-alive expiry")
    assert loaded_names(c) == {default.name}
    assert c.stats()["evictions"]["keep_alive"] >= 2  # 3 if the 1 s one expired in between


def test_max_models_limit(daemon_factory: Factory, three_models: list[Path]) -> None:
    d = daemon_factory("--max-models", "2")
    c = d.client()
    for m in three_models:
        c.load(str(m), n_ctx=512)
    until(lambda: len(loaded_names(c)) == 2, what="two models")
    assert loaded_names(c) == {three_models[1].name, three_models[2].name}
    assert c.stats()["evictions"]["slots"] == 1


def test_an_evicted_models_prompts_come_back_with_it(
    daemon_factory: Factory, three_models: list[Path]
) -> None:
    """Switching A -> B -> A with room for one model: A's prompt is not evaluated again."""
    d = daemon_factory("--max-models", "1")
    c = d.client()
    a, b = str(three_models[0]), str(three_models[1])
    prompt = "a long shared system prompt about stones and rivers " * 4

    def ask(model: str) -> tuple[str, dict[str, Any]]:
        gen = c.generate(model, prompt, raw=True, max_tokens=4, temperature=0.0, n_ctx=512)
        text = gen.text()
        assert gen.done is not None
        return text, gen.done

    first, done = ask(a)
    assert done["usage"]["prompt_tokens_reused"] == 0
    ask(b)  # evicts a, whose runner writes a's snapshots to the prompt cache dir
    until(lambda: loaded_names(c) == {three_models[1].name}, what="a evicted")
    again, done = ask(a)
    assert done["timings"]["load_s"] > 0  # really loaded again
    assert again == first
    assert done["usage"]["prompt_tokens_reused"] == done["usage"]["prompt_tokens"]


def test_concurrent_requests_join_one_load(
    daemon_factory: Factory, three_models: list[Path]
) -> None:
    d = daemon_factory()
    model = str(three_models[0])
    clients = [d.client() for _ in range(6)]
    results: list[str] = []
    errors: list[BaseException] = []

    def ask(client: Any) -> None:
        try:
            results.append(client.generate(model, "same", max_tokens=4, temperature=0).text())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(cl,)) for cl in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(results) == 6 and len(set(results)) == 1
    stats = clients[0].stats()
    assert stats["loads"] == 1 and stats["requests"] == 6
    assert len(clients[0].ps()) == 1


def test_busy_model_is_not_evicted_the_request_waits(
    daemon_factory: Factory, long_model: Path, three_models: list[Path]
) -> None:
    probe = daemon_factory()
    c = probe.client()
    c.load(str(long_model), n_ctx=4096)
    c.load(str(three_models[0]), n_ctx=512)
    sizes = [_accounted(r) for r in rows(c).values()]
    probe.stop()
    cap = max(sizes) + min(sizes) // 2  # room for one model only

    d = daemon_factory("--memory-cap", str(cap))
    busy = d.client()
    gen = busy.generate(str(long_model), "a", max_tokens=4000, n_ctx=4096, temperature=0)
    stream = iter(gen)
    next(stream)
    other = d.client()
    got: list[str] = []
    waiter = threading.Thread(
        target=lambda: got.append(
            other.generate(str(three_models[0]), "b", max_tokens=3, n_ctx=512).text()
        )
    )
    waiter.start()
    watcher = d.client()
    until(
        lambda: rows(watcher).get(three_models[0].name, {}).get("state") == "waiting",
        what="second model waiting for room",
    )
    busy_row = rows(watcher)[long_model.name]
    assert busy_row["state"] == "ready" and busy_row["in_flight"] == 1
    assert next(stream)  # the busy model keeps generating
    gen.close()  # cancel: the model becomes idle and may now be evicted
    waiter.join(30)
    assert got and isinstance(got[0], str)
    assert loaded_names(watcher) == {three_models[0].name}
    stats = watcher.stats()
    assert stats["evictions"]["memory"] == 1 and stats["used_bytes"] <= cap


def test_file_changed_on_disk_is_reloaded(
    daemon_factory: Factory, three_models: list[Path], tmp_path: Path
) -> None:
    live = tmp_path / "live.gguf"
    shutil.copy(three_models[0], live)
    d = daemon_factory()
    c = d.client()
    before = c.generate(str(live), "hello there", max_tokens=8, temperature=0).text()
    shutil.copy(three_models[1], live.with_suffix(".tmp"))
    os.replace(live.with_suffix(".tmp"), live)
    expected = c.generate(str(three_models[1]), "hello there", max_tokens=8, temperature=0).text()
    assert expected != before
    after = c.generate(str(live), "hello there", max_tokens=8, temperature=0).text()
    assert after == expected
    until(lambda: c.stats()["evictions"]["file_changed"] == 1, what="old entry retired")
    assert c.stats()["loads"] == 3


def test_long_prompt_grows_the_context(daemon_factory: Factory, three_models: list[Path]) -> None:
    d = daemon_factory()
    c = d.client()
    model = str(three_models[0])
    c.load(model, n_ctx=256)
    gen = c.generate(model, "a " * 600, max_tokens=4, temperature=0)
    assert gen.text() is not None and gen.done is not None
    assert gen.done["timings"]["prompt_tokens"] > 256
    assert gen.done["n_ctx"] >= gen.done["timings"]["prompt_tokens"]
    assert rows(c)[three_models[0].name]["n_ctx"] == gen.done["n_ctx"]
    assert c.stats()["evictions"]["reload"] == 1


def test_prompt_longer_than_training_context_is_refused(
    daemon_factory: Factory, model_factory: Factory
) -> None:
    model = model_factory("llama", **dict(ggufgen.TINY, context_length=512))
    d = daemon_factory()
    c = d.client()
    with pytest.raises(ContextExceededError) as info:
        c.generate(str(model), "a " * 900, max_tokens=4).text()
    assert "tokens" in info.value.message
    assert info.value.details["prompt_tokens"] > 512
    c.generate(str(model), "short", max_tokens=2).text()  # the model still serves


def test_prompt_longer_than_the_budget_allows_says_how_many_fit(
    daemon_factory: Factory, long_model: Path
) -> None:
    def measured_baseline(client: Any) -> int:
        """Wait until the daemon sizes loads with its spare runner's measured baseline."""
        return int(
            until(
                lambda: (b := client.stats()["runner_baseline_bytes"]) != memory.RUNNER_BASELINE
                and b,
                what="the spare runner's measured baseline (not the built-in default)",
            )
        )

    probe = daemon_factory()
    c = probe.client()
    base1 = measured_baseline(c)
    c.load(str(long_model), n_ctx=1024)
    row = rows(c)[long_model.name]
    probe.stop()
    # A little more than n_ctx 1024 needs; the margin covers the runner baseline, which each
    # daemon measures on its own spare runner (it differs by a MiB or two between processes).
    cap = _accounted(row) + 4 * 1024 * 1024
    d = daemon_factory("--memory-cap", str(cap), "--ctx-floor", "256")
    c = d.client()
    base2 = measured_baseline(c)
    with pytest.raises(ContextExceededError) as info:
        c.generate(str(long_model), "a " * 20000, max_tokens=4).text()
    fit = info.value.details["n_ctx_max"]
    why = f"row {row}, cap {cap}, baselines {base1} then {base2}"
    assert isinstance(fit, int) and 1024 <= fit < 20000, why
    assert str(fit) in info.value.message


def test_model_larger_than_the_whole_budget_is_refused_at_once(
    daemon_factory: Factory, three_models: list[Path]
) -> None:
    d = daemon_factory("--memory-cap", str(8 * 1024 * 1024))
    c = d.client()
    with pytest.raises(InsufficientMemoryError) as info:
        c.generate(str(three_models[0]), "x", max_tokens=2).text()
    assert info.value.details["budget_bytes"] == 8 * 1024 * 1024
    assert "MiB" in info.value.message
    assert c.ps() == []


def test_show_pin_and_unload(daemon_factory: Factory, three_models: list[Path]) -> None:
    d = daemon_factory("--max-models", "2")
    c = d.client()
    a, b, third = three_models
    shown = c.show(str(a))
    assert shown["fits"] is True and shown["would_evict"] == [] and shown["loaded"] is None
    assert shown["n_ctx"] % 256 == 0 and shown["estimate"]["kv_cache"] > 0
    pinned = c.load(str(a), pinned=True)
    assert pinned["pinned"] is True and pinned["state"] == "ready"
    c.load(str(b))
    c.load(str(third))  # b goes: a is pinned
    until(lambda: loaded_names(c) == {a.name, third.name}, what="b evicted, a kept")
    assert c.show(str(b))["would_evict"] == [third.stem]
    assert c.unload(str(a)) == {"unloaded": [a.stem], "unloading_when_idle": []}
    assert c.unload(all=True)["unloaded"] == [third.stem]
    until(lambda: c.ps() == [], what="everything unloaded")
    assert c.stats()["evictions"]["explicit"] == 2

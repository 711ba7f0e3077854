"""Unit tests for modeld.model.memory and modeld.model.kvcache: KV sizing rules, repack accounting,
component sums.

Expected KV and repack sizes for the real gemma-3-270m model are the figures llama.cpp itself
logs when it loads that model ("llama_kv_cache: size = ...", "CPU_REPACK model buffer size").
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from modeld.model import kvcache, memory
from modeld.model.gguf import read_model_info
from modeld.model.modelinfo import ModelInfo, TensorInfo

MiB = 1 << 20
SRC = Path(__file__).resolve().parent.parent / "src" / "modeld"


def make_info(**overrides: Any) -> ModelInfo:
    """A llama-like ModelInfo; per-layer fields follow block_count unless given."""
    n_layer = int(overrides.pop("block_count", 4))
    fields: dict[str, Any] = dict(
        path="/models/x.gguf", file_size=100 * MiB, gguf_version=3, architecture="llama",
        name="x", size_label=None, file_type=1, quantization="F16", context_length=8192,
        block_count=n_layer, embedding_length=512, head_count=8,
        head_count_kv=(2,) * n_layer, key_length=64, value_length=64, sliding_window=None,
        sliding_layers=(False,) * n_layer, vocab_size=1000, has_chat_template=False,
        pooling_type=None, tensor_bytes=90 * MiB, tensor_count=10, data_offset=4096,
        feed_forward_length=1024,
    )  # fmt: skip
    fields.update(overrides)
    return ModelInfo(**fields)


def tensor(
    name: str, type_name: str, shape: tuple[int, ...], n_bytes: int, offset: int
) -> TensorInfo:
    return TensorInfo(name, 0, type_name, shape, n_bytes, offset)


@pytest.fixture(scope="module")
def gemma(default_model: Path) -> ModelInfo:
    return read_model_info(default_model)


# --- KV cache -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_ctx", "swa_full", "expected_mib"),
    [
        (512, False, 1.5 + 7.5),  # 3 global layers x 512 cells + 15 sliding x 512
        (4096, False, 12.0 + 15.0),  # sliding layers capped at 512 + 512 = 1024 cells
        (32768, False, 96.0 + 15.0),
        (4096, True, 72.0),  # swa_full: every layer keeps 4096 cells
    ],
)
def test_gemma_kv_cache_matches_llama_cpp_log(
    gemma: ModelInfo, n_ctx: int, swa_full: bool, expected_mib: float
) -> None:
    assert kvcache.kv_cache_bytes(gemma, n_ctx, swa_full=swa_full) == expected_mib * MiB


def test_gemma_kv_bytes_per_token(gemma: ModelInfo) -> None:
    # 18 layers x 1 KV head x (256 + 256) x 2 bytes
    assert kvcache.kv_bytes_per_token(gemma) == 18 * 1 * (256 + 256) * 2


@pytest.mark.parametrize(
    ("n_ctx", "n_ubatch", "n_seq", "swa_full", "expected"),
    [
        (100, 512, 1, False, (256, 256)),  # padded to 256; window never exceeds the context
        (700, 512, 1, False, (768, 768)),
        (4096, 512, 1, False, (4096, 1024)),
        (4096, 256, 1, False, (4096, 768)),
        (8192, 512, 2, False, (8192, 1536)),  # window per sequence + ubatch
        (4096, 512, 1, True, (4096, 4096)),
    ],
)
def test_kv_cells_rule(
    n_ctx: int, n_ubatch: int, n_seq: int, swa_full: bool, expected: tuple[int, int]
) -> None:
    info = make_info(block_count=6, sliding_window=512, sliding_layers=(True,) * 5 + (False,))
    cells = kvcache.kv_cells(info, n_ctx, swa_full=swa_full, n_ubatch=n_ubatch, n_seq=n_seq)
    assert cells == expected


def test_parallel_sequences_have_a_kv_stream_each() -> None:
    """The runner's N sequences (``kv_unified`` false): each stream keeps window + ubatch
    sliding cells, so N streams cost N times that (measured: docs/benchmarks.md, x4 and x8)."""
    info = make_info(block_count=6, sliding_window=512, sliding_layers=(True,) * 5 + (False,))
    assert kvcache.kv_cells(info, 4 * 4096, n_seq=4, unified=False) == (16384, 4 * 1024)
    assert kvcache.kv_cells(info, 4 * 4096, n_seq=4) == (16384, 4 * 512 + 512)
    assert kvcache.kv_cells(info, 4 * 512, n_seq=4, unified=False) == (2048, 2048)  # capped
    generate = memory.estimate(info, 4 * 4096, n_seq=4)
    # the estimate of generate mode is per stream, with the generate runner's micro-batch
    assert generate.swa_cells == 4 * (512 + memory.GENERATE_N_UBATCH)


def test_kv_cells_without_sliding_layers() -> None:
    assert kvcache.kv_cells(make_info(), 1000) == (1024, 0)


@pytest.mark.parametrize(
    ("type_k", "type_v", "per_elem"),
    [
        ("f16", "f16", 2.0),
        ("f32", "f32", 4.0),
        ("q8_0", "q8_0", 34 / 32),
        ("q4_0", "q4_0", 18 / 32),
    ],
)
def test_kv_types(type_k: str, type_v: str, per_elem: float) -> None:
    info = make_info()  # 4 layers x 2 KV heads x 64 dims
    got = kvcache.kv_cache_bytes(info, 1024, type_k=type_k, type_v=type_v)
    assert got == int(4 * 2 * (64 + 64) * per_elem * 1024)


def test_per_layer_kv_heads_are_summed() -> None:
    info = make_info(block_count=3, head_count_kv=(4, 0, 1))  # layer 1 has no KV (e.g. shared)
    assert kvcache.kv_bytes_per_token(info) == (4 + 0 + 1) * (64 + 64) * 2


def test_unknown_kv_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="q8_0"):
        kvcache.kv_type_bytes("q3_k")


def test_quantized_v_needs_flash_attention() -> None:
    with pytest.raises(ValueError, match="flash attention"):
        memory.estimate(make_info(), 1024, type_v="q8_0", flash_attn=False)


# --- weights and repack -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "type_name", "shape", "repacked"),
    [
        ("blk.0.ffn_down.weight", "Q4_K", (2048, 640), True),
        ("blk.0.attn_q.weight", "Q4_0", (1024, 1024), True),
        ("output.weight", "Q4_0", (1024, 32000), True),
        ("token_embd.weight", "Q4_K", (640, 262144), False),  # used by get_rows
        ("blk.0.attn_v.weight", "Q8_0", (640, 256), False),
        ("blk.0.attn_v.weight", "Q6_K", (640, 256), False),
        ("blk.0.attn_k.weight", "Q4_0", (640, 4), False),  # rows not a multiple of 8
        ("blk.0.attn_norm.weight", "F32", (640,), False),
    ],
)
def test_is_repacked(name: str, type_name: str, shape: tuple[int, ...], repacked: bool) -> None:
    assert memory.is_repacked(tensor(name, type_name, shape, 1, 0)) is repacked


def test_gemma_repack_buffer_matches_llama_cpp_log(gemma: ModelInfo) -> None:
    file_bytes, anon = memory.weight_bytes(gemma)
    assert anon / MiB == pytest.approx(12.66, abs=0.01)  # "CPU_REPACK model buffer size"
    assert file_bytes / MiB == pytest.approx(235.16, abs=0.01)  # "CPU_Mapped model buffer size"


def test_mapped_span_excludes_repacked_tail() -> None:
    tensors = (
        tensor("token_embd.weight", "Q4_0", (512, 1000), 100, 0),
        tensor("blk.0.attn_norm.weight", "F32", (512,), 10, 100),
        tensor("blk.0.ffn_up.weight", "Q4_0", (512, 1024), 200, 110),  # repacked, at the end
    )
    info = make_info(tensors=tensors, tensor_bytes=310)
    assert memory.weight_bytes(info) == (110, 200)
    assert memory.weight_bytes(info, repack=False) == (310, 0)
    assert memory.weight_bytes(info, mmap=False) == (0, 310)


def test_without_tensor_table_weights_are_the_tensor_bytes() -> None:
    info = make_info(tensor_bytes=123)
    assert memory.weight_bytes(info) == (123, 0)
    assert memory.weight_bytes(info, mmap=False) == (0, 123)


# --- the estimate as a whole --------------------------------------------------------------


def test_total_is_the_sum_of_components_without_baseline(gemma: ModelInfo) -> None:
    e = memory.estimate(gemma, 4096)
    assert e.total == e.weights + e.kv_cache + e.compute + e.output + e.overhead
    assert e.total_bytes == e.total
    assert e.with_baseline == e.total + e.runner_baseline
    assert e.file_backed + e.anonymous == e.total
    assert e.weights == e.weights_file + e.weights_anon
    assert e.to_dict()["total"] == e.total
    assert not e.approximate


def test_prompt_cache_is_its_own_component_in_generate_mode(gemma: ModelInfo) -> None:
    plain = memory.estimate(gemma, 4096)
    cached = memory.estimate(gemma, 4096, prompt_cache=32 * memory.MiB)
    assert plain.prompt_cache == 0  # the default: what bench/calibrate.py measures
    assert cached.prompt_cache == 32 * memory.MiB
    # kept beside the calibrated total, like the runner baseline
    assert cached.total == plain.total
    assert cached.to_dict()["prompt_cache"] == 32 * memory.MiB
    # embedding runners keep no prompt snapshots
    embed = memory.estimate(gemma, 4096, mode="embed", prompt_cache=32 * memory.MiB)
    assert embed.prompt_cache == 0


def test_n_ctx_is_rounded_up(gemma: ModelInfo) -> None:
    assert memory.estimate(gemma, 1000).n_ctx == 1024
    assert memory.estimate(gemma, 1000) == memory.estimate(gemma, 1024)


def test_estimate_is_monotone_in_n_ctx(gemma: ModelInfo) -> None:
    totals = [memory.estimate(gemma, n).total for n in range(256, 40000, 256 * 7)]
    assert totals == sorted(totals)
    assert totals[-1] > totals[0]


def test_compute_grows_with_ubatch_and_width() -> None:
    small = memory.compute_bytes(make_info(), 4096, n_ubatch=128)
    big = memory.compute_bytes(make_info(), 4096, n_ubatch=512)
    wide = memory.compute_bytes(make_info(feed_forward_length=8192), 4096, n_ubatch=512)
    assert small < big < wide


def test_no_flash_attention_costs_more_and_is_approximate(gemma: ModelInfo) -> None:
    fa = memory.estimate(gemma, 8192)
    no_fa = memory.estimate(gemma, 8192, flash_attn=False)
    assert no_fa.compute > fa.compute
    assert no_fa.approximate and any("flash" in n for n in no_fa.notes)


def test_embed_mode_and_synonym(gemma: ModelInfo) -> None:
    a = memory.estimate(gemma, 2048, mode="embed")
    assert a == memory.estimate(gemma, 2048, embedding=True)
    assert memory.estimate(gemma, 2048, embedding=False) == memory.estimate(gemma, 2048)


def test_embed_with_lm_head_is_chunked_like_the_runner(gemma: ModelInfo) -> None:
    # runner: n_batch = n_ubatch = min(512, n_ctx), decodes EMBED_CHUNK tokens at a time;
    # llama-cpp-python: n_seq_max = min(n_batch, 256), output buffer for that many rows
    e = memory.estimate(gemma, 2048, mode="embed")
    rows = memory.embed_seq_max(512)
    assert rows == 256
    assert e.output == rows * 4 * (gemma.vocab_size + gemma.embedding_length)
    chunk = memory.EMBED_CHUNK
    assert e.compute == memory.compute_bytes(
        gemma, 2048, n_ubatch=chunk, n_seq=rows, logits_rows=chunk
    )
    # the touched compute pages hold one chunk's logits, not the whole context's
    assert chunk * gemma.vocab_size * 4 < e.compute < (chunk + 8) * gemma.vocab_size * 4
    assert not e.approximate  # calibrated (docs/benchmarks.md)


def test_embed_compute_does_not_grow_with_the_context(gemma: ModelInfo) -> None:
    small, big = (memory.estimate(gemma, n, mode="embed") for n in (512, 8192))
    assert big.output == small.output
    assert big.compute - small.compute < 4 * MiB  # only the attention masks grow
    assert big.total - small.total < big.kv_cache  # the KV cache is what grows
    # the old whole-context-batch model said 1.3 GiB at 512; the runner needs about 630 MiB
    assert 560 * MiB < small.total < 700 * MiB


def test_embed_context_gives_sliding_layers_the_whole_context(gemma: ModelInfo) -> None:
    # a unified KV cache for 256 sequences: n_swa x 256 + n_ubatch cells >= n_ctx
    e = memory.estimate(gemma, 4096, mode="embed")
    assert e.kv_cells == e.swa_cells == 4096
    assert e.kv_cache == kvcache.kv_cache_bytes(gemma, 4096, swa_full=True) == 72 * MiB
    # generate mode keeps the window and a micro-batch
    assert memory.estimate(gemma, 4096).swa_cells == 512 + memory.GENERATE_N_UBATCH


def test_embed_seq_max_follows_the_batch(gemma: ModelInfo) -> None:
    assert [memory.embed_seq_max(n) for n in (1, 64, 256, 512, 4096)] == [1, 64, 256, 256, 256]
    small = memory.estimate(gemma, 4096, mode="embed", n_batch=128, n_ubatch=128)
    assert small.output == 128 * 4 * (gemma.vocab_size + gemma.embedding_length)
    assert small.total < memory.estimate(gemma, 4096, mode="embed").total


def test_runner_embeds_with_the_estimates_chunk() -> None:
    # runner/embedding.py imports llama_cpp, so read its source: the constant must come from
    # model/memory.py
    tree = ast.parse((SRC / "runner" / "embedding.py").read_text())
    values = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "EMBED_CHUNK" for t in node.targets)
    ]
    assert len(values) == 1
    assert ast.unparse(values[0]) == "memory.EMBED_CHUNK"


def test_embed_for_pooled_encoder_has_no_logits_and_no_kv_cache() -> None:
    bert = make_info(architecture="bert", pooling_type=1)
    e = memory.estimate(bert, 512, mode="embed")
    assert e.output == 512 * 4 * bert.embedding_length
    assert e.kv_cache == 0 and e.kv_cells == 0  # llama.cpp builds BERT without a KV cache
    assert e.compute == memory.encoder_compute_bytes(bert, 512)
    assert not e.approximate  # calibrated: the bert reranker row of docs/benchmarks.md
    assert memory.estimate(bert, 512, mode="rerank").total == e.total


def test_encoder_compute_follows_llama_cpp_reserve() -> None:
    """llama.cpp's compute-buffer reserve for BERT (flash attention), read from its log:
    n_embd 768, n_ff 3072 at 512 tokens 11.01 MiB; n_ff 1536 (attention-bound) 8.76 MiB."""
    wide = make_info(
        architecture="bert", pooling_type=4, embedding_length=768, feed_forward_length=3072
    )
    narrow = make_info(
        architecture="bert", pooling_type=4, embedding_length=768, feed_forward_length=1536
    )
    assert abs(memory.encoder_compute_bytes(wide, 512) / MiB - 11.01) < 0.05
    assert abs(memory.encoder_compute_bytes(narrow, 512) / MiB - 8.76) < 0.05


def test_pooled_decoder_keeps_its_kv_cache_and_is_approximate() -> None:
    qwen = make_info(architecture="qwen3", pooling_type=3)
    e = memory.estimate(qwen, 512, mode="embed")
    assert e.kv_cache > 0
    assert e.approximate and any("pooled" in n for n in e.notes)


def test_explicit_batch_sizes_win(gemma: ModelInfo) -> None:
    bert = make_info(architecture="bert", pooling_type=1)
    whole = memory.estimate(bert, 4096, mode="embed")  # pooled: the whole context in one batch
    assert whole.compute > memory.estimate(bert, 4096, mode="embed", n_batch=512).compute
    assert memory.estimate(gemma, 4096, n_ubatch=128).compute < memory.estimate(gemma, 4096).compute


def test_recurrent_is_flagged_approximate() -> None:
    e = memory.estimate(make_info(recurrent=True), 2048)
    assert e.approximate and any("recurrent" in n for n in e.notes)


def test_gpu_layers_move_memory_to_vram(gemma: ModelInfo) -> None:
    cpu = memory.estimate(gemma, 4096)
    gpu = memory.estimate(gemma, 4096, gpu_layers=99)
    assert gpu.vram > 0 and cpu.vram == 0
    assert gpu.total < cpu.total
    assert gpu.approximate


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        memory.estimate(make_info(), 0)
    with pytest.raises(ValueError):
        memory.estimate(make_info(), 512, mode="chat")  # type: ignore[arg-type]


def test_vocab_size_drives_overhead() -> None:
    small = memory.estimate(make_info(vocab_size=1000), 2048)
    big = memory.estimate(make_info(vocab_size=262144), 2048)
    assert big.overhead - small.overhead == memory.VOCAB_BYTES_PER_TOKEN * 261144
    assert big.output - small.output == 4 * 261144


def test_naive_formula(gemma: ModelInfo) -> None:
    n = 32768
    expected = int((gemma.file_size + n * kvcache.kv_bytes_per_token(gemma)) * 1.1)
    assert memory.naive_estimate(gemma, n) == expected
    # the naive rule ignores the sliding window: twice the real estimate at 32k
    assert memory.naive_estimate(gemma, n) > 1.8 * memory.estimate(gemma, n).total


def test_estimate_is_frozen(gemma: ModelInfo) -> None:
    e = memory.estimate(gemma, 512)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.kv_cache = 0  # type: ignore[misc]


def test_policy_modules_import_no_native_libraries() -> None:
    code = (
        "import sys, modeld.model.memory, modeld.model.ctx, modeld.model.probe\n"
        "bad = {'llama_cpp', 'zmq', 'psutil', 'pynvml'} & set(sys.modules)\n"
        "print(sorted(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

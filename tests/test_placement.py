"""Placement by VRAM with fake cards (pure: issue 34). A TinyLlama-1.1B-shaped f16 model
(22 blocks, 2.2 GB), cards of every kind: none, one large, one mostly taken by another process,
one too small for a layer, two of different sizes."""

from __future__ import annotations

from typing import Any

import pytest

from modeld import config, sizing
from modeld.model import kvcache, placement
from modeld.model.modelinfo import ModelInfo, TensorInfo
from modeld.model.placement import CUDA_PROCESS_BYTES, VRAM_MARGIN, Gpu, Where

MiB, GiB = 1 << 20, 1 << 30


def llama(n_layer: int = 22, n_embd: int = 2048, n_ff: int = 5632, vocab: int = 32000,
          head_kv: int = 4) -> ModelInfo:  # fmt: skip
    """A llama-shaped f16 model with a real tensor table (sizes as in the file)."""
    kv_w = n_embd // 32 * head_kv
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_embd, vocab))]
    for i in range(n_layer):
        shapes += [(f"blk.{i}.attn_q.weight", (n_embd, n_embd)),
                   (f"blk.{i}.attn_k.weight", (n_embd, kv_w)),
                   (f"blk.{i}.attn_v.weight", (n_embd, kv_w)),
                   (f"blk.{i}.attn_output.weight", (n_embd, n_embd)),
                   (f"blk.{i}.ffn_gate.weight", (n_embd, n_ff)),
                   (f"blk.{i}.ffn_up.weight", (n_embd, n_ff)),
                   (f"blk.{i}.ffn_down.weight", (n_ff, n_embd))]  # fmt: skip
    shapes.append(("output.weight", (n_embd, vocab)))
    tensors, offset = [], 4096
    for name, shape in shapes:
        n = shape[0] * shape[1] * 2
        tensors.append(TensorInfo(name, 1, "F16", shape, n, offset))
        offset += n
    total = offset - 4096
    return ModelInfo(
        path="/m/tiny.gguf", file_size=offset, gguf_version=3, architecture="llama", name="t",
        size_label=None, file_type=1, quantization="F16", context_length=32768,
        block_count=n_layer, embedding_length=n_embd, head_count=32,
        head_count_kv=(head_kv,) * n_layer, key_length=64, value_length=64,
        sliding_window=None, sliding_layers=(False,) * n_layer, vocab_size=vocab,
        has_chat_template=False, pooling_type=None, tensor_bytes=total,
        tensor_count=len(tensors), data_offset=4096, feed_forward_length=n_ff,
        tensors=tuple(tensors),
    )  # fmt: skip


INFO = llama()
H100 = Gpu(0, "NVIDIA H100", 80 * GiB, 79 * GiB)


def test_no_card_is_cpu_only_as_before() -> None:
    p = placement.place(INFO, 4096, (), None)
    assert (p.gpu_layers, p.vram, p.reason) == (0, (), "no GPU")
    est, _ = placement.planned(INFO, 4096, Where())
    assert est == sizing.estimate_n(INFO, 4096)  # exactly today's estimate
    assert placement.place(INFO, 4096, (H100,), 0).gpu_layers == 0  # gpu_layers 0: CPU only


def test_one_large_card_takes_every_layer() -> None:
    p = placement.place(INFO, 4096, (H100,), None)
    assert p.gpu_layers == INFO.block_count + 1 and p.reason == "every layer fits the free VRAM"
    est = placement.with_layers(INFO, 4096, p.gpu_layers)
    assert p.vram == (est.vram,)
    # the full offload is modeld's old full-offload estimate plus the CUDA process cost
    old = sizing.estimate_n(INFO, 4096, offload=True)
    assert est.vram == old.vram + CUDA_PROCESS_BYTES
    assert placement.processor(p.gpu_layers, p.n_layers) == "100% GPU"
    assert est.total < old.total + 1  # RAM keeps the input embedding, vocab, output buffers


def test_a_card_mostly_taken_by_another_process_gets_some_layers() -> None:
    taken = Gpu(0, "H100", 80 * GiB, 2 * GiB)  # NVML free: others hold 78 GiB
    p = placement.place(INFO, 4096, (taken,), None)
    assert 0 < p.gpu_layers < p.n_layers
    assert p.vram[0] <= taken.free - VRAM_MARGIN
    more = placement.place(INFO, 4096, (taken,), p.gpu_layers + 1)
    assert more.gpu_layers == p.gpu_layers  # one more would not fit: never more than fits
    cpu, gpu = (int(x.rstrip("%")) for x in
                placement.processor(p.gpu_layers, p.n_layers).split()[0].split("/"))
    assert cpu + gpu == 100 and gpu == round(100 * p.gpu_layers / p.n_layers)
    # with RAM for the rest: what left the card is in the RAM estimate
    est = placement.with_layers(INFO, 4096, p.gpu_layers)
    assert est.weights > placement.with_layers(INFO, 4096, p.n_layers).weights


def test_a_card_too_small_for_one_layer() -> None:
    small = Gpu(0, "small", 2 * GiB, VRAM_MARGIN + CUDA_PROCESS_BYTES + 10 * MiB)
    p = placement.place(INFO, 4096, (small,), None)
    assert p.gpu_layers == 0 and "layer" in p.reason


def test_two_cards_split_by_what_each_can_take() -> None:
    big = llama(n_layer=40, n_embd=4096, n_ff=11008)  # ~13 GB of f16
    a, b = Gpu(0, "A", 24 * GiB, 10 * GiB), Gpu(1, "B", 24 * GiB, 5 * GiB)
    p = placement.place(big, 4096, (a, b), None)
    assert 0 < p.gpu_layers < p.n_layers  # 15 GiB free in all: not all of ~13 GB + contexts
    assert p.vram[0] <= a.free - VRAM_MARGIN and p.vram[1] <= b.free - VRAM_MARGIN
    assert p.vram[0] > p.vram[1] and len(p.tensor_split) == 2
    assert p.tensor_split[0] > p.tensor_split[1] and sum(p.tensor_split) == pytest.approx(1, 1e-3)
    both = placement.place(big, 4096, (a, Gpu(1, "B", 24 * GiB, 20 * GiB)), None)
    assert both.gpu_layers == both.n_layers


def test_layers_asked_are_honoured_when_they_fit() -> None:
    p = placement.place(INFO, 4096, (H100,), 5)
    assert p.gpu_layers == 5 and p.reason == "5 layers asked"
    assert placement.place(INFO, 4096, (H100,), 999).gpu_layers == INFO.block_count + 1


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_quantized_kv_cache_shrinks_every_tier(kv: str) -> None:
    f16 = placement.with_layers(INFO, 32768, 23)
    q = placement.with_layers(INFO, 32768, 23, kv_type=kv)
    per = kvcache.KV_TYPE_BYTES[kv] / 2
    kv_f16 = kvcache.kv_cache_bytes(INFO, 32768)
    assert f16.vram - q.vram == pytest.approx(kv_f16 * (1 - per), rel=0.01)
    ram = sizing.estimate_n(INFO, 32768, kv_type=kv)
    assert ram.kv_cache == pytest.approx(kv_f16 * per, rel=0.01)
    # the same card takes more context with it: the largest n_ctx that keeps every layer on
    card = Gpu(0, "L4", 24 * GiB, 4 * GiB)
    longest = {t: max(n for n in range(4096, 65537, 4096)
                      if placement.place(INFO, n, (card,), None, kv_type=t).gpu_layers == 23)
               for t in ("f16", kv)}  # fmt: skip
    assert longest[kv] > longest["f16"]


def test_options_come_from_the_load_the_model_then_the_settings(tmp_path: Any) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('kv_cache_type = "q8_0"\n'
                   '[model_options.big]\nkv_cache_type = "q4_0"\ngpu_layers = 3\n')
    s, _ = config.load_settings(env={}, config_path=cfg)
    assert placement.option(None, "big", "kv_cache_type", s) == "q4_0"
    assert placement.option(None, "other", "kv_cache_type", s) == "q8_0"
    assert placement.option("f16", "big", "kv_cache_type", s) == "f16"
    assert placement.option(None, "big", "gpu_layers", s) == 3
    assert placement.option(None, "other", "gpu_layers", s) is None  # auto
    s, src = config.load_settings(env={"OLLAMA_KV_CACHE_TYPE": "q4_0"}, config_path=cfg)
    assert s.kv_cache_type == "q4_0" and src["kv_cache_type"] == "env:OLLAMA_KV_CACHE_TYPE"
    bad = tmp_path / "bad.toml"
    bad.write_text('[model_options.x]\nkv_cache_type = "q3"\n')
    with pytest.raises(Exception, match="KV cache type"):
        config.load_settings(env={}, config_path=bad)

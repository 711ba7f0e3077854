"""The fast GGUF reader: every ModelInfo field, checked against known values and gguf-py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFValueType, LlamaFileType

import ggufgen
from modeld.errors import InvalidModelError, ModelNotFoundError
from modeld.model import gguf as mg
from modeld.model import ggufarch
from modeld.model.modelinfo import ModelInfo


def write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def meta(
    arch: str = "llama", n_layer: int = 4, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Minimal metadata for a header-only file of architecture ``arch``."""
    return {
        "general.architecture": arch,
        f"{arch}.context_length": 4096,
        f"{arch}.block_count": n_layer,
        f"{arch}.embedding_length": 256,
        f"{arch}.attention.head_count": 8,
        **(extra or {}),
    }


def info_of(tmp_path: Path, data: bytes) -> ModelInfo:
    return mg.read_model_info(write(tmp_path, data))


# --- generated models, cross-checked with gguf-py's GGUFReader -----------------------------


def assert_matches_gguf_py(info: ModelInfo) -> None:
    """Tensor table, data offset and every scalar agree with the reference reader."""
    ref = GGUFReader(info.path)
    assert info.data_offset == ref.data_offset
    assert info.tensor_count == len(ref.tensors)
    for mine, theirs in zip(info.tensors, ref.tensors, strict=True):
        assert mine.name == theirs.name
        assert mine.shape == tuple(int(d) for d in theirs.shape)
        assert mine.ggml_type == int(theirs.tensor_type)
        assert mine.type_name == theirs.tensor_type.name
        assert mine.n_bytes == int(theirs.n_bytes)
        assert info.data_offset + mine.offset == int(theirs.data_offset)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            assert key not in info.scalars
            continue
        expected = field.contents()
        got = info.scalars[key]
        assert got == pytest.approx(expected) if isinstance(expected, float) else got == expected
    assert info.tensor_bytes + info.data_offset <= info.file_size


def test_tiny_model_every_field(tiny_model: Path) -> None:
    p = ggufgen.TINY
    info = mg.read_model_info(tiny_model)
    assert info.path == str(tiny_model.resolve())
    assert info.file_size == tiny_model.stat().st_size
    assert info.gguf_version == 3
    assert info.architecture == "llama"
    assert info.name == "modeld-test-llama"
    assert info.size_label is None
    assert info.file_type == 0
    assert info.quantization == "F32"
    assert info.context_length == p["context_length"]
    assert info.block_count == p["n_layer"]
    assert info.embedding_length == p["n_embd"]
    assert info.head_count == p["n_head"]
    assert info.head_count_kv == (p["n_head"],) * p["n_layer"]  # defaults to head_count
    assert info.key_length == info.value_length == p["n_embd"] // p["n_head"]
    assert info.sliding_window is None
    assert info.sliding_layers == (False,) * p["n_layer"]
    assert info.vocab_size == p["n_vocab"]
    assert info.has_chat_template is False
    assert info.pooling_type is None
    assert info.is_embedding_model is False
    assert info.recurrent is False
    assert info.feed_forward_length == p["n_ff"]
    assert info.expert_count == 0
    assert info.tokenizer_model == "llama"
    assert (info.bos_token_id, info.eos_token_id) == (ggufgen.BOS_ID, ggufgen.EOS_ID)
    assert info.tensor_count == 3 + 9 * p["n_layer"]
    n_params = 2 * p["n_vocab"] * p["n_embd"] + p["n_embd"]
    n_params += p["n_layer"] * (
        4 * p["n_embd"] ** 2 + 3 * p["n_embd"] * p["n_ff"] + 2 * p["n_embd"]
    )
    assert info.tensor_bytes == 4 * n_params
    assert info.notes == ()
    assert_matches_gguf_py(info)


def test_gqa_model(gqa_model: Path) -> None:
    p = ggufgen.GQA
    info = mg.read_model_info(gqa_model)
    assert info.head_count == 8
    assert info.head_count_kv == (2, 2, 2)
    assert info.key_length == info.value_length == p["n_embd"] // p["n_head"]
    assert (info.file_type, info.quantization) == (1, "F16")
    k = next(t for t in info.tensors if t.name == "blk.0.attn_k.weight")
    assert k.shape == (p["n_embd"], 2 * p["n_embd"] // p["n_head"])  # ggml order: ne0 first
    assert (k.type_name, k.n_bytes) == ("F16", 2 * k.shape[0] * k.shape[1])
    assert_matches_gguf_py(info)


def test_q8_model(q8_model: Path) -> None:
    info = mg.read_model_info(q8_model)
    assert (info.file_type, info.quantization) == (7, "Q8_0")
    emb = next(t for t in info.tensors if t.name == "token_embd.weight")
    assert (emb.type_name, emb.n_bytes) == ("Q8_0", 512 * 64 // 32 * 34)
    assert_matches_gguf_py(info)


def test_swa_model(swa_model: Path) -> None:
    p = ggufgen.SWA
    info = mg.read_model_info(swa_model)
    assert info.architecture == "gemma3"
    assert info.sliding_window == p["sliding_window"]
    # llama.cpp's gemma3 default: period 6, the 6th layer of each group is global.
    assert info.sliding_layers == (True, True, True, True, True, False, True)
    assert info.head_count_kv == (1,) * 7
    assert info.key_length == info.value_length == p["head_dim"]
    assert any("default for gemma3" in n for n in info.notes)
    assert not any(t.name == "output.weight" for t in info.tensors)  # tied embeddings
    assert_matches_gguf_py(info)


def test_chat_template(tiny_chat_model: Path, tiny_model: Path) -> None:
    assert mg.read_model_info(tiny_chat_model).has_chat_template is True
    assert mg.read_chat_template(tiny_chat_model) == ggufgen.CHATML_TEMPLATE
    assert mg.read_chat_template(tiny_model) is None


def test_default_gemma_model(default_model: Path) -> None:
    info = mg.read_model_info(default_model)
    assert info.file_size == 253113024
    assert (info.architecture, info.name, info.size_label) == ("gemma3", "Gemma 3 270m", "270M")
    assert (info.file_type, info.quantization) == (15, "Q4_K_M")
    assert (info.context_length, info.block_count, info.embedding_length) == (32768, 18, 640)
    assert (info.head_count, info.head_count_kv) == (4, (1,) * 18)
    assert (info.key_length, info.value_length) == (256, 256)
    assert info.sliding_window == 512
    assert info.sliding_layers == ((True,) * 5 + (False,)) * 3
    assert info.vocab_size == 262144
    assert info.has_chat_template is False
    assert (info.feed_forward_length, info.expert_count) == (2048, 0)
    assert (info.tokenizer_model, info.bos_token_id, info.eos_token_id) == ("llama", 2, 1)
    assert (info.tensor_count, info.data_offset) == (236, 6525120)
    assert info.data_offset + info.tensor_bytes == info.file_size  # tensors fill the file
    types = {t.type_name for t in info.tensors}
    assert types == {"F32", "Q5_0", "Q4_K", "Q8_0", "Q6_K"}
    assert info.scalars["gemma3.rope.freq_base"] == 1000000.0
    assert info.summary()["sliding_layers"] == list(info.sliding_layers)


# --- tables, against gguf-py ----------------------------------------------------------------


def test_ggml_type_table_matches_gguf_py() -> None:
    for qtype, (block, size) in GGML_QUANT_SIZES.items():
        assert ggufarch.GGML_TYPES[int(qtype)] == (qtype.name, block, size)
    assert set(ggufarch.GGML_TYPES) == {int(q) for q in GGML_QUANT_SIZES}


def test_file_type_names_match_gguf_py() -> None:
    for ft in LlamaFileType:
        name = ft.name.removeprefix("MOSTLY_").removeprefix("ALL_")
        assert ggufarch.quantization_name(int(ft)) == name
    assert ggufarch.quantization_name(None) is None
    assert ggufarch.quantization_name(999) == "UNKNOWN_999"


def test_ggml_type_size() -> None:
    assert ggufarch.ggml_type_size(12, (256, 10)) == 144 * 10  # Q4_K
    assert ggufarch.ggml_type_size(0, (3, 4, 5)) == 4 * 60
    with pytest.raises(ValueError, match="block size"):
        ggufarch.ggml_type_size(8, (33, 2))
    with pytest.raises(ValueError, match="unknown"):
        ggufarch.ggml_type_size(5, (32,))


# --- metadata interpretation on hand-made headers -------------------------------------------


@pytest.mark.parametrize(
    ("arch", "n_layer", "extra", "window", "sliding"),
    [
        ("gemma2", 4, {}, 4096, "1010"),  # default window and period 2
        ("gemma2", 4, {"gemma2.attention.sliding_window": 128}, 128, "1010"),
        ("cohere2", 8, {"cohere2.attention.sliding_window": 4096}, 4096, "11101110"),
        ("gemma3n", 5, {"gemma3n.attention.sliding_window": 512}, 512, "11110"),
        ("gpt-oss", 4, {"gpt-oss.attention.sliding_window": 128}, 128, "1010"),
        ("llama4", 4, {}, 8192, "1110"),  # chunked attention by default
        ("llama4", 4, {"llama4.attention.sliding_window": 0}, None, "0000"),
        ("olmo2", 4, {}, None, "0000"),  # SWA only when the window is set
        ("olmo2", 4, {"olmo2.attention.sliding_window": 4096}, 4096, "1110"),
        ("smallthinker", 5, {"smallthinker.attention.sliding_window": 64}, 64, "01110"),
        ("phi3", 2, {"phi3.attention.sliding_window": 2047}, None, "00"),  # disabled upstream
        (
            "gemma3",
            3,
            {"gemma3.attention.sliding_window": 64, "gemma3.attention.sliding_window_pattern": 0},
            64,
            "111",
        ),
        (
            "gemma3",
            4,
            {"gemma3.attention.sliding_window": 64, "gemma3.attention.sliding_window_pattern": 2},
            64,
            "1010",
        ),
        (
            "gemma3",
            3,
            {
                "gemma3.attention.sliding_window": 64,
                "gemma3.attention.sliding_window_pattern": [False, True, False],
            },
            64,
            "010",
        ),
        ("gemma3", 3, {}, None, "000"),  # no window: no sliding layers
    ],
)
def test_sliding_window_rules(
    tmp_path: Path, arch: str, n_layer: int, extra: dict[str, Any], window: int | None, sliding: str
) -> None:
    info = info_of(tmp_path, ggufgen.raw_gguf(meta(arch, n_layer, extra)))
    assert info.sliding_window == window
    assert info.sliding_layers == tuple(c == "1" for c in sliding)


def test_per_layer_arrays_and_defaults(tmp_path: Path) -> None:
    m = meta(
        "openelm",
        3,
        {
            "openelm.attention.head_count": [4, 8, 12],
            "openelm.attention.head_count_kv": [1, 2, 3],
            "openelm.feed_forward_length": [100, 300, 200],
            "openelm.attention.key_length": 64,
        },
    )
    info = info_of(tmp_path, ggufgen.raw_gguf(m))
    assert info.head_count == 12
    assert info.head_count_kv == (1, 2, 3)
    assert info.feed_forward_length == 300
    assert (info.key_length, info.value_length) == (64, 256 // 12)
    assert info.quantization is None and info.vocab_size == 0 and info.tensor_count == 0


def test_per_layer_array_of_wrong_length_is_invalid(tmp_path: Path) -> None:
    m = meta("llama", 3, {"llama.attention.head_count_kv": [1, 2]})
    with pytest.raises(InvalidModelError, match="2 entries for 3 layers"):
        info_of(tmp_path, ggufgen.raw_gguf(m))


def test_recurrent_and_embedding_flags(tmp_path: Path) -> None:
    mamba = info_of(tmp_path, ggufgen.raw_gguf(meta("mamba", 2)))
    assert mamba.recurrent and any("recurrent" in n for n in mamba.notes)
    hybrid = info_of(tmp_path, ggufgen.raw_gguf(meta("jamba", 2)))
    assert hybrid.recurrent and any("hybrid" in n for n in hybrid.notes)
    bert = info_of(tmp_path, ggufgen.raw_gguf(meta("bert", 2, {"bert.pooling_type": 1})))
    assert bert.pooling_type == 1 and bert.is_embedding_model and not bert.recurrent


def test_quantization_guessed_and_vocab_from_embedding(tmp_path: Path) -> None:
    tensors = [
        ("token_embd.weight", (256, 1000), 12, 0),  # Q4_K
        ("output_norm.weight", (256,), 0, 144 * 1000),
    ]
    data = ggufgen.raw_gguf(meta(), tensors=tensors, tensor_data=144 * 1000 + 1024)
    info = info_of(tmp_path, data)
    assert (info.file_type, info.quantization) == (None, "Q4_K")
    assert any("guessed" in n for n in info.notes)
    assert info.vocab_size == 1000
    assert info.tensor_bytes == 144 * 1000 + 1024


def test_version_2_and_custom_alignment(tmp_path: Path) -> None:
    tensors = [("a", (64,), 0, 0), ("b", (64,), 0, 256)]
    data = ggufgen.raw_gguf(
        meta(extra={"general.alignment": 64}),
        tensors=tensors,
        tensor_data=512,
        version=2,
        alignment=64,
    )
    info = info_of(tmp_path, data)
    assert info.gguf_version == 2 and info.data_offset % 64 == 0
    assert [t.offset for t in info.tensors] == [0, 256]


# --- errors ---------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no such file"):
        mg.read_model_info(tmp_path / "nope.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelError, match="is a directory"):
        mg.read_model_info(tmp_path)


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(InvalidModelError, match="not a regular file"):
        mg.read_model_info(fifo)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "not a GGUF file"),
        (b"GGU", "not a GGUF file"),
        (b"PK\x03\x04" + b"\0" * 100, "not a GGUF file"),
        (b"GGUF", "truncated"),
        (b"GGUF\x01\0\0\0" + b"\0" * 16, "unsupported GGUF version 1"),
        (b"GGUF\x04\0\0\0" + b"\0" * 16, "unsupported GGUF version 4"),
        (b"GGUF\0\0\0\x03" + b"\0" * 16, "big-endian"),
        (ggufgen.raw_gguf({"general.architecture": "llama"}), "required key"),
        (ggufgen.raw_gguf({"general.type": "adapter"}), r"architecture is missing.*adapter"),
        (ggufgen.raw_gguf(meta(extra={"llama.block_count": "four"})), "non-negative integer"),
        (ggufgen.raw_gguf(meta(extra={"general.alignment": 48})), "power of two"),
        (
            ggufgen.raw_gguf(meta(), kv_blobs=[ggufgen.encode_kv("general.architecture", 8, "x")]),
            "duplicate metadata key",
        ),
        (
            ggufgen.raw_gguf(meta(), kv_blobs=[b"\3\0\0\0\0\0\0\0abc\x0d\0\0\0"]),
            "unknown value type 13",
        ),
        (
            ggufgen.raw_gguf(meta(), kv_blobs=[ggufgen.encode_kv("k", 8, b"\xff\xfe")]),
            "not valid UTF-8",
        ),
        (
            ggufgen.raw_gguf(
                meta(),
                kv_blobs=[ggufgen.encode_string("k") + b"\x09\0\0\0" + b"\x09\0\0\0" + b"\0" * 8],
            ),
            "nested array",
        ),
        (
            ggufgen.raw_gguf(meta(), tensors=[("t", (32,), 0, 0)] * 2, tensor_data=256),
            "duplicate tensor",
        ),
        (
            ggufgen.raw_gguf(meta(), tensors=[("t", (32, 1, 1, 1, 1), 0, 0)], tensor_data=256),
            "5 dimensions",
        ),
        (ggufgen.raw_gguf(meta(), tensors=[("t", (1 << 40, 1 << 40), 0, 0)]), "absurd shape"),
        (
            ggufgen.raw_gguf(meta(), tensors=[("t", (32,), 99, 0)], tensor_data=256),
            "unknown ggml type 99",
        ),
        (ggufgen.raw_gguf(meta(), tensors=[("t", (33,), 8, 0)], tensor_data=256), "block size"),
        (ggufgen.raw_gguf(meta(), tensors=[("t", (32,), 0, 4)], tensor_data=256), "not aligned"),
        (
            ggufgen.raw_gguf(meta(), tensors=[("t", (64,), 0, 0)], tensor_data=255),
            "past the end of the file",
        ),
        (
            ggufgen.raw_gguf(meta(), tensors=[("x" * 64, (32,), 0, 0)], tensor_data=256),
            "tensor name is 64 bytes",
        ),
    ],
)
def test_invalid_files(tmp_path: Path, data: bytes, match: str) -> None:
    path = write(tmp_path, data)
    with pytest.raises(InvalidModelError, match=match) as exc:
        mg.read_model_info(path)
    assert str(path) in exc.value.message  # the message names the file
    assert exc.value.hint
    assert exc.value.details["path"] == str(path)


def test_reader_imports_only_the_stdlib() -> None:
    code = (
        "import sys, modeld.model.gguf; "
        "bad = {'numpy', 'gguf', 'llama_cpp', 'zmq', 'psutil', 'pynvml'} & set(sys.modules); "
        "print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_split_model_counts_every_shard(tmp_path: Path) -> None:
    def shard(no: int, extra: dict[str, Any], name: str) -> Path:
        m = dict(extra, **{"split.no": no, "split.count": 3})
        data = ggufgen.raw_gguf(m, tensors=[(name, (64, 4), 0, 0)], tensor_data=1024)
        return write(tmp_path, data, f"m-{no + 1:05d}-of-00003.gguf")

    first = shard(0, meta(), "token_embd.weight")
    second = shard(1, {}, "blk.0.attn_q.weight")
    third = shard(2, {}, "output.weight")
    info = mg.read_model_info(first)
    assert [t.name for t in info.tensors] == ["token_embd.weight", "blk.0.attn_q.weight",
                                              "output.weight"]  # fmt: skip
    assert (info.tensor_count, info.tensor_bytes) == (3, 3 * 1024)
    assert any("3 shards" in n for n in info.notes)
    with pytest.raises(InvalidModelError, match="shard 1 of a 3-part"):
        mg.read_model_info(second)
    third.unlink()
    with pytest.raises(InvalidModelError, match=r"00003-of-00003\.gguf is missing"):
        mg.read_model_info(first)


def test_unreadable_path_names() -> None:
    with pytest.raises(InvalidModelError, match="null byte"):
        mg.read_model_info("bad\0name.gguf")
    with pytest.raises(InvalidModelError, match="cannot read"):
        mg.read_model_info("x" * 5000 + ".gguf")  # ENAMETOOLONG


def test_notes_say_why_layers_do_or_do_not_slide(tmp_path: Path) -> None:
    phi3 = info_of(
        tmp_path, ggufgen.raw_gguf(meta("phi3", 2, {"phi3.attention.sliding_window": 2047}))
    )
    assert phi3.notes == (
        "phi3.attention.sliding_window=2047 is not used by llama.cpp; full attention",
    )
    gemma2 = info_of(tmp_path, ggufgen.raw_gguf(meta("gemma2", 2)))
    assert gemma2.notes == (
        "sliding-window layers follow llama.cpp's default for gemma2 (period 2)",
    )
    explicit = meta("gemma3", 2, {"gemma3.attention.sliding_window": 8,
                                  "gemma3.attention.sliding_window_pattern": 2})  # fmt: skip
    assert info_of(tmp_path, ggufgen.raw_gguf(explicit)).notes == ()

"""Malformed GGUF input: the reader raises InvalidModelError or parses, and nothing else.

llama.cpp aborts its process on many malformed files, so modeld must reject them first and
must itself never crash, hang or allocate wildly on them. Cases are deterministic (fixed seeds)
and mutate one file in place with pwrite, so thousands run in a few seconds.
"""

from __future__ import annotations

import os
import random
import struct
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

import ggufgen
from modeld.errors import InvalidModelError
from modeld.model.gguf import read_chat_template, read_model_info
from modeld.model.modelinfo import ModelInfo

FUZZ_PARAMS = dict(
    n_layer=1,
    n_embd=32,
    n_head=2,
    n_ff=64,
    n_vocab=300,
    context_length=256,
    chat_template=ggufgen.CHATML_TEMPLATE,
)


@pytest.fixture(scope="module")
def fuzz_model(model_factory: object) -> bytes:
    assert callable(model_factory)
    path = model_factory("llama", **FUZZ_PARAMS)
    return Path(path).read_bytes()


@pytest.fixture(scope="module")
def header_end(fuzz_model: bytes, tmp_path_factory: pytest.TempPathFactory) -> int:
    path = tmp_path_factory.mktemp("fuzz") / "orig.gguf"
    path.write_bytes(fuzz_model)
    return read_model_info(path).data_offset


def check(path: Path) -> ModelInfo | None:
    """Parse; an InvalidModelError is fine, any other exception fails the test."""
    try:
        info = read_model_info(path)
    except InvalidModelError as exc:
        assert str(path) in exc.message
        return None
    # A parse must still be self-consistent.
    assert info.data_offset + max((t.offset + t.n_bytes for t in info.tensors), default=0) <= (
        info.file_size
    )
    assert len(info.head_count_kv) == len(info.sliding_layers) == info.block_count
    return info


class Mutable:
    """One file on disk holding ``original``; patch bytes in place and restore them."""

    def __init__(self, path: Path, original: bytes) -> None:
        self.path, self.original = path, original
        path.write_bytes(original)
        self.fd = os.open(path, os.O_WRONLY)

    def patched(self, offset: int, data: bytes) -> Iterator[Path]:
        os.pwrite(self.fd, data, offset)
        try:
            yield self.path
        finally:
            os.pwrite(self.fd, self.original[offset : offset + len(data)], offset)

    def close(self) -> None:
        os.close(self.fd)


def count_fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, width) of every count, length, type and offset field in the header.

    An independent, minimal walk of the format (it trusts the file, which is well formed).
    """
    fields = [(8, 8), (16, 8)]  # tensor count, kv count
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def string(pos: int, record: bool = True) -> int:
        if record:
            fields.append((pos, 8))
        (n,) = struct.unpack_from("<Q", data, pos)
        return pos + 8 + int(n)

    for _ in range(n_kv):
        pos = string(pos)
        fields.append((pos, 4))
        (vtype,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if vtype == 8:
            pos = string(pos)
        elif vtype == 9:
            fields += [(pos, 4), (pos + 4, 8)]
            etype, count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if etype == 8:
                for i in range(count):  # record a few element lengths, not all
                    pos = string(pos, record=i < 3 or i == count - 1)
            else:
                pos += sizes[etype] * count
        else:
            pos += sizes[vtype]
    for _ in range(n_tensors):
        pos = string(pos)
        fields.append((pos, 4))
        (n_dims,) = struct.unpack_from("<I", data, pos)
        pos += 4
        fields += [(pos + 8 * i, 8) for i in range(n_dims)]
        pos += 8 * n_dims
        fields += [(pos, 4), (pos + 4, 8)]
        pos += 12
    return fields


def test_truncation_at_every_header_offset(
    fuzz_model: bytes, header_end: int, tmp_path: Path
) -> None:
    path = tmp_path / "t.gguf"
    path.write_bytes(fuzz_model)
    cuts = [
        *range(header_end + 1),
        *range(header_end + 1, len(fuzz_model), 997),
        len(fuzz_model) - 1,
    ]
    for cut in sorted(cuts, reverse=True):  # shrink one file in place: no rewrites
        os.truncate(path, cut)
        with pytest.raises(InvalidModelError):
            read_model_info(path)
    assert len(cuts) > 5000


def test_absurd_values_in_count_fields(fuzz_model: bytes, tmp_path: Path) -> None:
    fields = count_fields(fuzz_model)
    assert len(fields) > 100
    size = len(fuzz_model)
    m = Mutable(tmp_path / "c.gguf", fuzz_model)
    outcomes = {"invalid": 0, "parsed": 0}
    try:
        for offset, width in fields:
            (orig,) = struct.unpack_from("<Q" if width == 8 else "<I", fuzz_model, offset)
            top = (1 << (8 * width)) - 1
            values = {0, 1, 2, 3, 7, 8, 9, 13, 1 << 31, top, top >> 1, orig + 1, max(orig - 1, 0)}
            if width == 8:
                values |= {1 << 32, size - 1, size, size + 1, size // 8}
            for v in sorted(x for x in values if 0 <= x <= top and x != orig):
                raw = v.to_bytes(width, "little")
                for p in m.patched(offset, raw):
                    outcomes["invalid" if check(p) is None else "parsed"] += 1
    finally:
        m.close()
    assert outcomes["invalid"] > 1000  # the corrupt values are caught ...
    assert outcomes["parsed"] > 0  # ... and harmless ones (e.g. a token id) still parse


def test_random_byte_flips(fuzz_model: bytes, header_end: int, tmp_path: Path) -> None:
    rng = random.Random(20261122)
    m = Mutable(tmp_path / "f.gguf", fuzz_model)
    invalid = 0
    try:
        for case in range(3000):
            n = rng.choice((1, 1, 2, 4, 8))
            # Mostly the header, where parsing happens; sometimes anywhere.
            limit = header_end if case % 10 else len(fuzz_model)
            offset = rng.randrange(0, limit - n)
            for p in m.patched(offset, rng.randbytes(n)):
                invalid += check(p) is None
                try:
                    template = read_chat_template(p)
                    assert template is None or isinstance(template, str)
                except InvalidModelError:
                    pass
    finally:
        m.close()
    assert 0 < invalid < 3000


@pytest.mark.parametrize(
    ("offset", "value"),
    [(8, 1 << 62), (16, 1 << 62), (8, (1 << 64) - 1), (16, 10**6), (24, (1 << 64) - 1)],
)
def test_absurd_counts_do_not_allocate(
    fuzz_model: bytes, tmp_path: Path, offset: int, value: int
) -> None:
    """Counts and lengths are checked against the file size before anything is allocated."""
    path = tmp_path / "a.gguf"
    path.write_bytes(fuzz_model[:offset] + struct.pack("<Q", value) + fuzz_model[offset + 8 :])
    tracemalloc.start()
    try:
        with pytest.raises(InvalidModelError):
            read_model_info(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(fuzz_model) + 256 * 1024


def test_huge_string_array_count_is_rejected_fast(tmp_path: Path) -> None:
    # A string array claiming 2**40 elements in a tiny file: rejected before the walk.
    blob = ggufgen.encode_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 1 << 40)
    data = ggufgen.raw_gguf({"general.architecture": "llama"}, kv_blobs=[blob + b"\0" * 64])
    path = tmp_path / "s.gguf"
    path.write_bytes(data)
    with pytest.raises(InvalidModelError, match="more than the file can hold"):
        read_model_info(path)


@pytest.mark.parametrize("magic", [b"GGUG", b"gguf", b"FUGG", b"\0\0\0\0", b"GGML", b"GGJT"])
def test_wrong_magic(fuzz_model: bytes, tmp_path: Path, magic: bytes) -> None:
    path = tmp_path / "w.gguf"
    path.write_bytes(magic + fuzz_model[4:])
    with pytest.raises(InvalidModelError, match="not a GGUF file"):
        read_model_info(path)


@pytest.mark.parametrize("version", [0, 1, 4, 5, 1 << 24, (1 << 32) - 1])
def test_wrong_version(fuzz_model: bytes, tmp_path: Path, version: int) -> None:
    path = tmp_path / "v.gguf"
    path.write_bytes(fuzz_model[:4] + struct.pack("<I", version) + fuzz_model[8:])
    with pytest.raises(InvalidModelError, match="unsupported GGUF version"):
        read_model_info(path)

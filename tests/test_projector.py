"""Which mmproj a model loads with (modeld.projector, pure: file names and GGUF headers) and
the bytes it is charged (issue 38)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import ggufgen
from modeld import projector
from modeld.config import Settings
from modeld.errors import InvalidModelError
from modeld.model import memory
from modeld.model.gguf import read_model_info, read_projector_info
from modeld.pull.store import write_record


def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


@pytest.fixture()
def files(model_factory: Callable[..., Path]) -> tuple[Path, Path, Path]:
    return (model_factory("llama", **ggufgen.TINY_CHAT),
            model_factory("mmproj", **ggufgen.TINY_MMPROJ),
            model_factory("mmproj", **dict(ggufgen.TINY_MMPROJ, n_embd_text=32)))  # fmt: skip


def test_the_projector_beside_a_model(tmp_path: Path, files: tuple[Path, Path, Path]) -> None:
    model, proj, narrow = files
    own = tmp_path / "repo"
    own.mkdir()
    m = _copy(model, own / "seer-Q8_0.gguf")
    assert projector.beside(m, 64) is None  # none there
    _copy(proj, own / "mmproj-model-f16.gguf")
    assert projector.beside(m, 64) == str(own / "mmproj-model-f16.gguf")  # a folder of one model
    flat = tmp_path / "models"
    flat.mkdir()
    seer, other = _copy(model, flat / "seer.gguf"), _copy(model, flat / "other.gguf")
    _copy(proj, flat / "mmproj-seer.gguf")
    assert projector.beside(seer, 64) == str(flat / "mmproj-seer.gguf")  # by name
    assert projector.beside(other, 64) is None  # never another model's projector
    _copy(narrow, flat / "mmproj-seer-small.gguf")
    assert projector.beside(seer, 64) == str(flat / "mmproj-seer.gguf")  # by projection_dim
    # pulled quantisations share the repository's folder: each one's record names its projector
    q4 = _copy(model, own / "seer-Q4_K_M.gguf")
    assert projector.beside(q4, 64) is None  # two models, a projector named after neither
    for pulled in (m, q4):
        write_record(pulled, {"model": "hf.co/o/seer", "mmproj": "mmproj-model-f16.gguf"})
        assert projector.beside(pulled, 64) == str(own / "mmproj-model-f16.gguf")
    write_record(q4, {"model": "hf.co/o/seer", "mmproj": "seer-Q8_0.gguf"})  # not a projector
    assert projector.beside(q4, 64) is None


def test_config_and_load_win_and_an_empty_path_means_none(
    tmp_path: Path, files: tuple[Path, Path, Path]
) -> None:
    model, proj, narrow = files
    m = _copy(model, tmp_path / "seer.gguf")
    _copy(proj, tmp_path / "mmproj-seer.gguf")
    info = read_model_info(m)
    assert projector.find(m, info, "seer", Settings()).path.endswith("mmproj-seer.gguf")  # type: ignore[union-attr]
    configured = Settings(mmproj={"seer": str(narrow)})
    assert projector.find(m, info, "seer", configured).path == str(narrow)  # type: ignore[union-attr]
    assert projector.find(m, info, "seer", Settings(mmproj={"seer": ""})) is None
    assert projector.find(m, info, "seer", configured, asked=str(proj)).path == str(proj)  # type: ignore[union-attr]
    with pytest.raises(InvalidModelError, match="not an image projector"):
        projector.find(m, info, "seer", Settings(), asked=str(model))


def test_memory_covers_weights_and_measured_overhead(files: tuple[Path, Path, Path]) -> None:
    _, proj, _ = files
    info = read_projector_info(proj)
    assert info.projector_type == "mlp" and info.vision and info.projection_dim == 64
    charged = projector.memory_bytes(info, 64)
    # measured on CPU: +3.3 MiB anonymous at load for this projector (projector.CONTEXT_BYTES),
    # and the decoded images a runner keeps, at most KEPT_BITMAP_BYTES
    fixed = projector.CONTEXT_BYTES + memory.KEPT_BITMAP_BYTES
    assert info.tensor_bytes + fixed <= charged < 4 * 1024 * 1024 + memory.KEPT_BITMAP_BYTES


def test_a_header_is_read_again_only_when_its_file_changed(
    tmp_path: Path, files: tuple[Path, Path, Path]
) -> None:
    import os

    model, proj, narrow = files
    m = _copy(model, tmp_path / "seer.gguf")
    p = _copy(proj, tmp_path / "mmproj-seer.gguf")
    info = read_model_info(m)
    first = projector.find(m, info, "seer", Settings())
    assert first is not None and projector.find(m, info, "seer", Settings()) is first  # kept
    p.write_bytes(narrow.read_bytes())  # another projector under the same name
    os.utime(p, ns=(os.stat(p).st_atime_ns, os.stat(p).st_mtime_ns + 1_000_000_000))
    again = projector.find(m, info, "seer", Settings())
    assert again is not first and again is not None
    width = read_projector_info(narrow).projection_dim
    assert again.projection_dim == width != first.projection_dim

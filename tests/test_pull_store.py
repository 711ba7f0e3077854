"""Pulled models on disk (modeld.pull.store) and how the registry resolves hub names to them:
plain files in a temp models dir, no network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modeld import registry
from modeld.config import Settings
from modeld.errors import ModelNotFoundError
from modeld.pull import store
from modeld.registry import list_models, normalize_ref, resolve


def make(models: Path, *names: str, record: dict[str, object] | None = None) -> Path:
    folder = models / "Org" / "Repo-GGUF"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"GGUF" + name.encode())
        if record is not None:
            store.write_record(folder / name, record)
    return folder


def test_hub_names_resolve_to_pulled_files(tmp_path: Path) -> None:
    folder = make(tmp_path, "m-Q8_0.gguf", "m-Q4_K_M.gguf", "m-F16.gguf")
    s = Settings(models_dir=tmp_path)
    assert resolve("hf.co/Org/Repo-GGUF", s).path == folder / "m-Q4_K_M.gguf"  # the default
    assert resolve("org/repo-gguf:q8_0", s).path == folder / "m-Q8_0.gguf"  # case-insensitive
    assert resolve("hf.co/Org/Repo-GGUF/m-F16.gguf", s).path == folder / "m-F16.gguf"
    assert resolve("m-F16", s).path == folder / "m-F16.gguf"  # the file stem, as before
    with pytest.raises(ModelNotFoundError) as err:
        resolve("Org/Repo-GGUF:Q2_K", s)
    assert "modeld pull Org/Repo-GGUF:Q2_K" in err.value.hint
    assert err.value.details["pullable"] is True
    # an existing relative path that looks like a hub name stays a path
    assert normalize_ref("Org/Repo-GGUF:Q8_0", cwd=tmp_path) == "Org/Repo-GGUF:Q8_0"
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "f:Q8_0").write_bytes(b"x")
    assert normalize_ref("dir/f:Q8_0", cwd=tmp_path) == str(tmp_path / "dir" / "f:Q8_0")


def test_split_models_need_every_shard_and_list_as_one(tmp_path: Path) -> None:
    shards = [f"big-Q6_K-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    folder = make(tmp_path, *shards[:2])
    s = Settings(models_dir=tmp_path)
    with pytest.raises(ModelNotFoundError):
        resolve("Org/Repo-GGUF:Q6_K", s)  # a shard is missing: not there
    make(tmp_path, shards[2])
    assert resolve("Org/Repo-GGUF:Q6_K", s).path == folder / shards[0]
    assert [m.name for m in list_models(s)] == ["big-Q6_K"]


def test_records_give_tags_and_rm_removes_shards_records_and_empty_folders(
        tmp_path: Path) -> None:
    shards = [f"big-Q6_K-0000{i}-of-00002.gguf" for i in (1, 2)]
    record = {"model": "hf.co/Org/Repo-GGUF:Q6_K", "digest": "sha256:" + "ab" * 32}
    folder = make(tmp_path, *shards, record=record)
    (tmp_path / "keep.gguf").write_bytes(b"GGUF")
    assert store.tag_of(str(folder / shards[0]), "big-Q6_K") == \
        ("hf.co/Org/Repo-GGUF:Q6_K", "ab" * 32)
    assert store.tag_of(str(tmp_path / "keep.gguf"), "keep") == ("keep", None)
    assert json.loads(store.record_path(folder / shards[1]).read_text())["schema_version"] == 1
    path = registry.removable("Org/Repo-GGUF:Q6_K", Settings(models_dir=tmp_path))
    removed = store.remove(path, tmp_path)
    assert removed == [folder / n for n in shards]
    assert not (tmp_path / "Org").exists() and (tmp_path / "keep.gguf").exists()

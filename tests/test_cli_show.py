"""`modeld show`, `list`, `config` and the exit-code contract, through the real console script.

These need no daemon: `show` plans locally when none is running (a private, empty socket dir
makes sure of that).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODELD = str(Path(sys.executable).parent / "modeld")


def run_cli(
    *args: str, env_extra: dict[str, str] | None = None, cwd: Path | None = None, tmp: Path
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(
        MODELD_RUNTIME_DIR=str(tmp / "run"),
        MODELD_SOCKET="",
        MODELD_LOG_DIR=str(tmp / "log"),
        MODELD_MODELS=str(tmp / "models"),
        MODELD_PROMPT_CACHE_DIR=str(tmp / "prompts"),
        MODELD_CONFIG=str(tmp / "config.toml"),
        MODELD_NO_AUTOSTART="1",
        NO_COLOR="1",
    )
    (tmp / "config.toml").touch()
    env.update(env_extra or {})
    return subprocess.run(
        [MODELD, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_show_default_model_json_shape(tmp_path: Path) -> None:
    out = run_cli("show", "--json", tmp=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["schema_version"] == 1 and data["kind"] == "show"
    assert data["info"]["architecture"] == "gemma3"
    assert data["info"]["quantization"] == "Q4_K_M"
    assert data["fits"] is True
    assert data["n_ctx"] % 256 == 0 and 256 <= data["n_ctx"] <= data["info"]["context_length"]
    assert data["ctx_reason"]
    est = data["estimate"]
    parts = est["weights"] + est["kv_cache"] + est["compute"] + est["output"] + est["overhead"]
    assert est["total"] == parts == data["estimate_bytes"]
    assert data["source"].startswith("local")


def test_show_text_mentions_context_and_reason(tmp_path: Path) -> None:
    out = run_cli("show", "--ctx", "1000", tmp=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "gemma3" in out.stdout
    assert "1024" in out.stdout  # rounded up to a multiple of 256


def test_show_generated_model_by_path(tmp_path: Path, gqa_model: Path) -> None:
    out = run_cli("show", str(gqa_model), "--json", tmp=tmp_path)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)["info"]
    assert info["architecture"] == "llama"
    assert min(info["head_count_kv"]) < info["head_count"]


def test_show_relative_path_resolved_from_cwd(tmp_path: Path, tiny_model: Path) -> None:
    out = run_cli("show", f"./{tiny_model.name}", "--json", cwd=tiny_model.parent, tmp=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["path"] == str(tiny_model.resolve())


def test_show_by_name_from_models_dir(tmp_path: Path, tiny_model: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "little.gguf").write_bytes(tiny_model.read_bytes())
    out = run_cli("show", "little", "--json", tmp=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["name"] == "little"
    listed = run_cli("list", "--json", tmp=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["models"]
    assert [r["name"] for r in rows] == ["little", "default"] and rows[0]["architecture"] == "llama"
    assert rows[1]["source"] == "default" and rows[1]["target"] == "gemma-3-270m-q4_k_m"
    assembled = Path(rows[1]["path"]).is_file()  # listing never assembles it
    assert rows[1]["architecture"] == ("gemma3" if assembled else None)
    assert rows[1]["size"] > 200 * 2**20


@pytest.mark.parametrize(
    ("content", "code", "needle"),
    [
        (None, 4, "does not exist"),
        (b"this is not a gguf file at all" * 10, 5, "GGUF"),
        (b"GGUF\x03\x00\x00\x00" + b"\x01" * 7, 5, "truncated"),
    ],
)
def test_show_bad_files_exit_codes(
    tmp_path: Path, content: bytes | None, code: int, needle: str
) -> None:
    path = tmp_path / "bad.gguf"
    if content is not None:
        path.write_bytes(content)
    out = run_cli("show", str(path), tmp=tmp_path)
    assert out.returncode == code, (out.returncode, out.stderr)
    assert needle.lower() in out.stderr.lower()
    assert out.stdout == ""


def test_error_json_on_stdout_with_json_flag(tmp_path: Path) -> None:
    out = run_cli("show", str(tmp_path / "missing.gguf"), "--json", tmp=tmp_path)
    assert out.returncode == 4
    data = json.loads(out.stdout)
    assert data["kind"] == "error" and data["error"]["code"] == "model_not_found"


def test_unknown_name_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    out = run_cli("show", "no-such-model", tmp=tmp_path)
    assert out.returncode == 4
    assert "no-such-model" in out.stderr


def test_usage_error_exit_2(tmp_path: Path) -> None:
    out = run_cli("show", "--no-such-flag", tmp=tmp_path)
    assert out.returncode == 2


def test_daemon_unavailable_exit_3(tmp_path: Path) -> None:
    out = run_cli("ps", tmp=tmp_path)
    assert out.returncode == 3
    assert "modeld serve" in out.stderr


def test_config_reports_sources(tmp_path: Path) -> None:
    out = run_cli("config", "--json", env_extra={"MODELD_MAX_MODELS": "5"}, tmp=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["settings"]["max_models"] == 5
    assert data["sources"]["max_models"] == "env:MODELD_MAX_MODELS"
    assert data["sources"]["keep_alive"] == "default"


def test_version(tmp_path: Path) -> None:
    from modeld import __version__

    out = run_cli("--version", tmp=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == f"modeld {__version__}"

"""Settings precedence (defaults < TOML < env < CLI), parsing, validation and error messages."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from modeld.config import ENV_VARS, Settings, load_settings
from modeld.errors import InvalidRequestError
from modeld.settingvalues import parse_bytes


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep the developer's own MODELD_* variables and config file out of these tests."""
    for var in [*ENV_VARS.values(), "MODELD_CONFIG", "MODELD_RUNTIME_DIR"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s, src = load_settings(env={})
    assert s.memory_fraction == 0.75 and s.memory_cap_bytes is None and s.max_models == 3
    assert s.keep_alive == "5m" and s.keep_alive_s == 300.0
    assert s.ctx_ceiling == 8192 and s.ctx_floor % 256 == 0 and s.ctx_floor <= s.ctx_ceiling
    assert s.max_message_bytes == 16 * 1024 * 1024 and s.spare_runner is True
    assert s.aliases == {} and s.log_level == "info"
    assert s.socket.startswith("ipc://") and s.socket.endswith("modeld.sock")
    assert isinstance(s.models_dir, Path) and isinstance(s.log_dir, Path)
    assert set(src.values()) == {"default"} and set(src) == set(s.to_dict())


def test_precedence_defaults_file_env_cli(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        'max_models = 5\nkeep_alive = "10m"\nmemory_fraction = 0.5\nlog_level = "debug"\n',
    )
    env = {"MODELD_MAX_MODELS": "7", "MODELD_KEEP_ALIVE": "-1"}
    s, src = load_settings({"max_models": 9, "keep_alive": None}, env=env, config_path=cfg)
    assert s.max_models == 9 and src["max_models"] == "cli"
    assert s.keep_alive == "-1" and s.keep_alive_s == math.inf
    assert src["keep_alive"] == "env:MODELD_KEEP_ALIVE", "a None CLI value must not override"
    assert s.memory_fraction == 0.5 and src["memory_fraction"] == f"config:{cfg}"
    assert s.log_level == "debug"
    assert src["ctx_ceiling"] == "default"


@pytest.mark.parametrize(
    ("var", "raw", "field", "expected"),
    [
        ("MODELD_MEMORY_CAP", "8GiB", "memory_cap_bytes", 8 * 1024**3),
        ("MODELD_MEMORY_CAP", "512M", "memory_cap_bytes", 512 * 1024**2),
        ("MODELD_MEMORY_CAP", "none", "memory_cap_bytes", None),
        ("MODELD_MEMORY_FRACTION", "0.9", "memory_fraction", 0.9),
        ("MODELD_SPARE_RUNNER", "off", "spare_runner", False),
        ("MODELD_SPARE_RUNNER", "1", "spare_runner", True),
        ("MODELD_CTX_CEILING", "16384", "ctx_ceiling", 16384),
        ("MODELD_MAX_MESSAGE_BYTES", "1MiB", "max_message_bytes", 1024**2),
        ("MODELD_LOAD_TIMEOUT", "30", "load_timeout_s", 30.0),
        ("MODELD_QUEUE_TIMEOUT", "2.5", "queue_timeout_s", 2.5),
        ("MODELD_LOG_LEVEL", "WARN", "log_level", "warning"),
        ("MODELD_THREADS", "auto", "threads", None),
        ("MODELD_THREADS", "4", "threads", 4),
        ("MODELD_SOCKET", "/tmp/x.sock", "socket", "ipc:///tmp/x.sock"),
        ("MODELD_SOCKET", "tcp://127.0.0.1:5555", "socket", "tcp://127.0.0.1:5555"),
        ("MODELD_MODELS", "/srv/models", "models_dir", Path("/srv/models")),
        ("MODELD_PROMPT_CACHE_MIB", "0", "prompt_cache_mib", 0),
        ("MODELD_PROMPT_CACHE_MIB", "64", "prompt_cache_mib", 64),
    ],
)
def test_env_values(var: str, raw: str, field: str, expected: object) -> None:
    s, src = load_settings(env={var: raw})
    assert getattr(s, field) == expected
    assert src[field] == f"env:{var}"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"MODELD_MAX_MODELS": "three"}, "max_models"),
        ({"MODELD_MAX_MODELS": "0"}, "max_models"),
        ({"MODELD_MEMORY_FRACTION": "1.5"}, "memory_fraction"),
        ({"MODELD_MEMORY_FRACTION": "0"}, "memory_fraction"),
        ({"MODELD_KEEP_ALIVE": "soon"}, "keep_alive"),
        ({"MODELD_CTX_FLOOR": "1000"}, "ctx_floor"),
        ({"MODELD_CTX_FLOOR": "4096", "MODELD_CTX_CEILING": "2048"}, "ctx_ceiling"),
        ({"MODELD_SPARE_RUNNER": "maybe"}, "spare_runner"),
        ({"MODELD_MEMORY_CAP": "lots"}, "memory_cap_bytes"),
        ({"MODELD_LOG_LEVEL": "chatty"}, "log_level"),
        ({"MODELD_LOAD_TIMEOUT": "0"}, "load_timeout_s"),
        ({"MODELD_MAX_MESSAGE_BYTES": "100"}, "max_message_bytes"),
        ({"MODELD_PROMPT_CACHE_MIB": "-1"}, "prompt_cache_mib"),
        ({"MODELD_PROMPT_CACHE_MIB": "lots"}, "prompt_cache_mib"),
    ],
)
def test_invalid_values_name_the_setting_and_source(env: dict[str, str], needle: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        load_settings(env=env)
    text = str(info.value)
    assert needle in text
    assert "MODELD_" in text, "the message must say where the value came from"


def test_unknown_key_in_config_names_key_and_file(tmp_path: Path) -> None:
    cfg = write(tmp_path, "max_model = 4\n")
    with pytest.raises(InvalidRequestError) as info:
        load_settings(env={}, config_path=cfg)
    err = info.value
    assert "max_model" in err.message and str(cfg) in err.message
    assert "max_models" in err.hint  # close match suggested
    assert err.details["key"] == "max_model"


def test_prompt_cache_from_file_and_cli(tmp_path: Path) -> None:
    cfg = write(tmp_path, "prompt_cache = 8\n")
    s, src = load_settings(env={}, config_path=cfg)
    assert s.prompt_cache_mib == 8 and s.prompt_cache_bytes(1 << 40) == 8 << 20
    assert src["prompt_cache_mib"].startswith("config:")
    s, src = load_settings({"prompt_cache_mib": 0}, env={}, config_path=cfg)
    assert s.prompt_cache_mib == 0 and src["prompt_cache_mib"] == "cli"
    # auto (the default): a share of the memory budget, between 32 MiB and 4 GiB
    auto = Settings()
    assert auto.prompt_cache_mib is None
    assert auto.prompt_cache_bytes(1 << 30) == 64 << 20
    assert auto.prompt_cache_bytes(100 << 20) == 32 << 20
    assert auto.prompt_cache_bytes(1 << 40) == 4 << 30
    s, _ = load_settings({"prompt_cache_mib": "auto"}, env={}, config_path=cfg)
    assert s.prompt_cache_mib is None


def test_unknown_cli_override() -> None:
    with pytest.raises(InvalidRequestError, match="bogus"):
        load_settings({"bogus": 1}, env={})


def test_config_file_forms(tmp_path: Path) -> None:
    cfg = write(
        tmp_path,
        """
memory-cap = "4 GiB"
keep_alive = 600
spare_runner = false
models = "~/models"
ctx_floor = 512

[aliases]
tiny = "tiny.gguf"
big = "/srv/big.gguf"
""",
    )
    s, src = load_settings(env={"HOME": "/home/x"}, config_path=cfg)
    assert s.memory_cap_bytes == 4 * 1024**3 and src["memory_cap_bytes"] == f"config:{cfg}"
    assert s.keep_alive == "600" and s.keep_alive_s == 600.0
    assert s.spare_runner is False and s.ctx_floor == 512
    assert s.models_dir == Path("~/models").expanduser()
    assert s.aliases == {"tiny": "tiny.gguf", "big": "/srv/big.gguf"}
    s2, _ = load_settings({"aliases": {"extra": "/e.gguf"}}, env={}, config_path=cfg)
    assert s2.aliases == {"tiny": "tiny.gguf", "big": "/srv/big.gguf", "extra": "/e.gguf"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("max_models = \n", "not valid TOML"),
        ("max_models = true\n", "max_models"),
        ("aliases = 3\n", "aliases"),
        ("[aliases]\nx = 3\n", "alias"),
    ],
)
def test_bad_config_file(tmp_path: Path, text: str, needle: str) -> None:
    cfg = write(tmp_path, text)
    with pytest.raises(InvalidRequestError) as info:
        load_settings(env={}, config_path=cfg)
    assert needle in str(info.value) and str(cfg) in str(info.value)


def test_config_file_location(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(InvalidRequestError, match="cannot read config file"):
        load_settings(env={}, config_path=missing)
    with pytest.raises(InvalidRequestError, match="cannot read config file"):
        load_settings(env={"MODELD_CONFIG": str(missing)})
    cfg = write(tmp_path, "max_models = 2\n")
    s, src = load_settings(env={"MODELD_CONFIG": str(cfg)})
    assert s.max_models == 2 and src["max_models"] == f"config:{cfg}"
    # The per-user default file may be missing without error.
    s, _ = load_settings(env={})
    assert s.max_models == 3


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1024, 1024),
        ("1024", 1024),
        ("1k", 1024),
        ("1KiB", 1024),
        ("1.5 MiB", 1536 * 1024),
        ("2g", 2 * 1024**3),
        ("2GB", 2 * 1024**3),
        ("1T", 1024**4),
        (3.9, 3),
    ],
)
def test_parse_bytes(value: object, expected: int) -> None:
    assert parse_bytes(value) == expected


@pytest.mark.parametrize("value", ["", "x", "-1", -1, "1 X", True, float("inf"), "1e3"])
def test_parse_bytes_invalid(value: object) -> None:
    with pytest.raises(ValueError):
        parse_bytes(value)


def test_settings_is_frozen_and_serializable() -> None:
    s, _ = load_settings(env={})
    with pytest.raises(AttributeError):
        s.max_models = 4  # type: ignore[misc]
    data = s.to_dict()
    assert data["models_dir"] == str(s.models_dir) and data["keep_alive"] == "5m"
    assert isinstance(Settings().ctx_ceiling, int)


def test_pure_modules_import_nothing_heavy() -> None:
    code = (
        "import sys, modeld.cache.policy, modeld.config, modeld.registry\n"
        "heavy = [m for m in ('llama_cpp', 'zmq', 'psutil', 'pynvml', 'numpy', 'rich', 'typer')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELD_MAX_MODELS", "6")
    s, src = load_settings()
    assert s.max_models == 6 and src["max_models"] == "env:MODELD_MAX_MODELS"


def test_settings_constructed_directly_have_real_paths() -> None:
    s = Settings()
    assert s.socket.startswith("ipc://") and s.models_dir.name == "models"


def test_each_setting_is_declared_once_and_reaches_every_table() -> None:
    """The declaration in ``Settings`` gives the environment variable, the parser, the synonyms,
    the man page's line and the daemon's flag: a new setting needs nothing else."""
    from modeld.config import SETTINGS
    from modeld.daemon.server import _parser

    parser = _parser()
    for name, spec in SETTINGS.items():
        assert spec.help.endswith("."), name
        flags = {f"--{n.replace('_', '-')}" for n in (name, *spec.synonyms)}
        assert flags <= set(parser._option_string_actions), name
    args = vars(parser.parse_args(["--memory-cap", "1GiB", "--no-spare", "--max-models", "2"]))
    settings, sources = load_settings(
        {k: v for k, v in args.items() if v is not None and k != "config"}, env={}
    )
    assert (settings.memory_cap_bytes, settings.spare_runner, settings.max_models) == (
        1 << 30, False, 2,
    )
    assert sources["memory_cap_bytes"] == sources["spare_runner"] == "cli"

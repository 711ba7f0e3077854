"""Settings: built-in defaults < TOML config file < ``MODELD_*`` environment < CLI flags.

One frozen :class:`Settings` per process, built by :func:`load_settings`, which also reports
where each value came from (``modeld stats``/``--verbose`` show it, so "why is my budget X?" has
an answer). Pure: reads one file and the given environment mapping, imports nothing heavy.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from modeld import paths
from modeld.cache.policy import parse_keep_alive
from modeld.errors import InvalidRequestError
from modeld.memory import MiB
from modeld.runner.promptcache import PROMPT_CACHE_MIB

LOG_LEVELS = ("debug", "info", "warning", "error")


DEFAULT_HTTP = "127.0.0.1:11434"  # Ollama's port, so its clients work unchanged
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


@dataclass(frozen=True)
class Settings:
    """Every tunable of the daemon and CLI (see docs/configuration.md for the table)."""

    socket: str = field(default_factory=paths.socket_endpoint)  # ZeroMQ endpoint
    models_dir: Path = field(default_factory=paths.models_dir)
    memory_fraction: float = 0.75  # share of available memory the cache may use
    memory_cap_bytes: int | None = None  # hard cap on the budget (None: no cap)
    max_models: int = 3  # LOADING + READY entries at once
    keep_alive: str = "5m"  # default keep-alive (Ollama syntax)
    ctx_floor: int = 2048  # smallest automatic context
    ctx_ceiling: int = 8192  # largest automatic context (grows on demand up to training ctx)
    max_message_bytes: int = 16 * MiB
    load_timeout_s: float = 120.0
    runner_stall_s: float = 15.0  # a runner silent (no heartbeat) this long is killed
    queue_timeout_s: float = 300.0  # how long a request may wait for room before timing out
    spare_runner: bool = True  # keep one runner pre-started with llama_cpp imported
    aliases: dict[str, str] = field(default_factory=dict)  # name -> path
    rpc: dict[str, tuple[str, ...]] = field(default_factory=dict)  # model name -> RPC workers
    log_dir: Path = field(default_factory=paths.log_dir)
    log_level: str = "info"
    threads: int | None = None  # runner threads; None → from the CPU quota
    failure_cooldown_s: float = 30.0  # first back-off after a failed load (doubles, ≤ 10 min)
    max_queue: int = 64  # requests waiting per daemon before new ones are refused
    eviction: str = "cost"  # victim order: "cost" (popularity x reload cost / size) or "lru"
    prompt_cache_mib: int = PROMPT_CACHE_MIB  # per generate-mode runner: prompt snapshots; 0 off
    http: str = DEFAULT_HTTP  # the Ollama/OpenAI HTTP front door: "host:port", or "off"
    api_key: str | None = None  # required (Authorization: Bearer) when http is not loopback
    http_origins: tuple[str, ...] = ()  # browser origins allowed (CORS); none by default
    parallel: int | None = None  # sequences one runner decodes together; None → auto (≤ 4)

    @property
    def prompt_cache_bytes(self) -> int:
        """The prompt-state cache of one generate-mode runner, in bytes (part of its estimate)."""
        return self.prompt_cache_mib * MiB

    @property
    def keep_alive_s(self) -> float:
        """The default keep-alive in seconds (``math.inf`` = until memory is needed)."""
        return parse_keep_alive(self.keep_alive)

    def to_dict(self) -> dict[str, object]:
        """JSON-safe form (paths as strings; the API key masked: `modeld config` prints this)."""
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, Path):
                data[key] = str(value)
            elif isinstance(value, tuple):
                data[key] = list(value)
        if data.get("api_key"):
            data["api_key"] = "(set)"
        return data

    @property
    def http_address(self) -> tuple[str, int] | None:
        """(host, port) of the HTTP front door, None when it is off."""
        return parse_http_address(self.http)


_FIELDS = {f.name: f for f in fields(Settings)}

# Environment variable for each setting (aliases come only from the config file or the CLI).
ENV_VARS: dict[str, str] = {
    "socket": "MODELD_SOCKET",
    "models_dir": "MODELD_MODELS",
    "memory_fraction": "MODELD_MEMORY_FRACTION",
    "memory_cap_bytes": "MODELD_MEMORY_CAP",
    "max_models": "MODELD_MAX_MODELS",
    "keep_alive": "MODELD_KEEP_ALIVE",
    "ctx_floor": "MODELD_CTX_FLOOR",
    "ctx_ceiling": "MODELD_CTX_CEILING",
    "max_message_bytes": "MODELD_MAX_MESSAGE_BYTES",
    "load_timeout_s": "MODELD_LOAD_TIMEOUT",
    "runner_stall_s": "MODELD_RUNNER_STALL_S",
    "queue_timeout_s": "MODELD_QUEUE_TIMEOUT",
    "spare_runner": "MODELD_SPARE_RUNNER",
    "log_dir": "MODELD_LOG_DIR",
    "log_level": "MODELD_LOG_LEVEL",
    "threads": "MODELD_THREADS",
    "failure_cooldown_s": "MODELD_FAILURE_COOLDOWN",
    "max_queue": "MODELD_MAX_QUEUE",
    "eviction": "MODELD_EVICTION",
    "prompt_cache_mib": "MODELD_PROMPT_CACHE_MIB",
    "http": "MODELD_HTTP",
    "api_key": "MODELD_API_KEY",
    "http_origins": "MODELD_HTTP_ORIGINS",
    "parallel": "MODELD_PARALLEL",
}
CONFIG_ENV = "MODELD_CONFIG"

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_bytes(value: object) -> int:
    """``"8GiB"``, ``"512M"``, ``"1.5g"``, ``"4000000"`` or an int → bytes.

    Suffixes K/M/G/T (with optional ``i`` and ``B``) are binary (1024-based), as memory sizes
    are reported by ``free``/``ps``; ``"GB"`` is treated the same for convenience.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative: {value}")
        return value
    if isinstance(value, float):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"not a size: {value!r}")
        return int(value)
    match = _SIZE_RE.match(str(value))
    if not match:
        raise ValueError(f"not a size: {value!r} (use e.g. 8GiB, 512MiB or a number of bytes)")
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * 1024 ** _POWERS[unit])


def _parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r} (use true/false, 1/0, yes/no, on/off)")


def _parse_int(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"not an integer: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return int(str(value).strip())


def _parse_float(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError(f"not a number: {value!r}")
    result = float(value) if isinstance(value, int | float) else float(str(value).strip())
    if math.isnan(result):
        raise ValueError("not a number: nan")
    return result


def _parse_path(value: object) -> Path:
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise ValueError(f"not a path: {value!r}")
    return Path(os.fspath(value)).expanduser()


def _parse_socket(value: object) -> str:
    text = str(value).strip()
    if not text:
        raise ValueError("empty socket endpoint")
    if "://" not in text:
        return f"ipc://{Path(text).expanduser()}"
    scheme, _, rest = text.partition("://")
    if scheme not in ("ipc", "tcp") or not rest:  # ZeroMQ would raise a bare ZMQError later
        raise ValueError(
            f"{text!r} is not an endpoint modeld can use: give ipc://PATH, tcp://HOST:PORT "
            "or a path"
        )
    return text


def _parse_optional_bytes(value: object) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "0")):
        return None
    result = parse_bytes(value)
    return result or None


def _parse_optional_int(value: object) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto", "0")):
        return None
    result = _parse_int(value)
    return result or None


def _parse_keep_alive_text(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"not a keep-alive: {value!r}")
    parse_keep_alive(value)  # validates; raises InvalidRequestError
    return str(value).strip()


def _parse_aliases(value: object) -> dict[str, str]:
    if isinstance(value, str):  # "name=path,name2=path2" (CLI/env friendly)
        pairs = [p for p in value.split(",") if p.strip()]
        value = dict(p.split("=", 1) for p in pairs if "=" in p) if all(
            "=" in p for p in pairs
        ) else None
    if not isinstance(value, Mapping):
        raise ValueError("aliases must be a table of name = \"path\"")
    out: dict[str, str] = {}
    for name, target in value.items():
        if not isinstance(target, str | os.PathLike) or not str(name).strip():
            raise ValueError(f"alias {name!r} must map to a path string")
        out[str(name).strip()] = os.fspath(target).strip()
    return out


def _parse_log_level(value: object) -> str:
    text = str(value).strip().lower()
    if text == "warn":
        text = "warning"
    if text not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}")
    return text




def parse_http_address(text: str) -> tuple[str, int] | None:
    """``"host:port"`` (IPv6 in brackets) → (host, port); ``off`` → None; ValueError else."""
    value = text.strip()
    if value.lower() in ("off", "none", "false", "no", "0", ""):
        return None
    host, sep, port = value.rpartition(":")
    if not sep:
        raise ValueError(f"expected HOST:PORT or off, got {text!r}")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad port in {text!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback IP literal (``127.0.0.0/8``, ``::1``, bracketed or not).
    Decided by parsing, never by prefix: ``127.0.0.1.evil.com`` is a DNS name anyone can point
    anywhere (DNS rebinding)."""
    name = host.strip().lower()
    if name in LOOPBACK_HOSTS:
        return True
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _parse_http(value: object) -> str:
    text = str(value)
    return text.strip() if parse_http_address(text) else "off"


def _parse_api_key(value: object) -> str | None:
    text = str(value).strip()
    return text or None


def _parse_origins(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return tuple(str(i).strip().rstrip("/") for i in items if str(i).strip())


def _parse_eviction(value: object) -> str:
    from modeld.cache.eviction import POLICIES

    text = str(value).strip().lower()
    if text not in POLICIES:
        raise ValueError(f"eviction must be one of {', '.join(POLICIES)}")
    return text


def _parse_rpc(value: object) -> dict[str, tuple[str, ...]]:
    """``[rpc]`` table: a model name (alias, models-dir name) -> its llama.cpp RPC workers,
    a list of "HOST:PORT" or one comma-separated string."""
    from modeld.rpc import parse_endpoints

    if not isinstance(value, Mapping):
        raise ValueError('rpc must be a table of name = ["HOST:PORT", ...]')
    out: dict[str, tuple[str, ...]] = {}
    for name, workers in value.items():
        if not isinstance(workers, str | list) or not str(name).strip():
            raise ValueError(f"rpc entry {name!r} must be a list of \"HOST:PORT\" strings")
        try:
            out[str(name).strip()] = parse_endpoints(workers)
        except InvalidRequestError as exc:
            raise ValueError(f"rpc entry {name!r}: {exc.message}") from exc
    return out


_PARSERS: dict[str, Callable[[object], Any]] = {
    "socket": _parse_socket,
    "models_dir": _parse_path,
    "memory_fraction": _parse_float,
    "memory_cap_bytes": _parse_optional_bytes,
    "max_models": _parse_int,
    "keep_alive": _parse_keep_alive_text,
    "ctx_floor": _parse_int,
    "ctx_ceiling": _parse_int,
    "max_message_bytes": parse_bytes,
    "load_timeout_s": _parse_float,
    "runner_stall_s": _parse_float,
    "queue_timeout_s": _parse_float,
    "spare_runner": _parse_bool,
    "aliases": _parse_aliases,
    "rpc": _parse_rpc,
    "log_dir": _parse_path,
    "log_level": _parse_log_level,
    "threads": _parse_optional_int,
    "failure_cooldown_s": _parse_float,
    "max_queue": _parse_int,
    "eviction": _parse_eviction,
    "prompt_cache_mib": _parse_int,
    "http": _parse_http,
    "api_key": _parse_api_key,
    "http_origins": _parse_origins,
    "parallel": _parse_optional_int,
}

# Friendlier spellings accepted in the config file and CLI overrides.
_SYNONYMS = {
    "memory_cap": "memory_cap_bytes",
    "models": "models_dir",
    "load_timeout": "load_timeout_s",
    "runner_stall": "runner_stall_s",
    "queue_timeout": "queue_timeout_s",
    "failure_cooldown": "failure_cooldown_s",
    "prompt_cache": "prompt_cache_mib",
}


def _canonical(name: str) -> str:
    key = name.strip().replace("-", "_").lower()
    return _SYNONYMS.get(key, key)


def _unknown_key(name: str, where: str) -> InvalidRequestError:
    import difflib  # only on this error path: keeps CLI start-up lean

    known = sorted(_FIELDS) + sorted(_SYNONYMS)
    close = difflib.get_close_matches(_canonical(name), known, n=3)
    hint = (
        f"did you mean {', '.join(close)}?"
        if close
        else f"known settings: {', '.join(sorted(_FIELDS))}"
    )
    return InvalidRequestError(
        f"unknown setting {name!r} in {where}",
        hint=hint,
        details={"key": name, "source": where},
    )


def _convert(name: str, value: object, where: str) -> object:
    try:
        return _PARSERS[name](value)
    except InvalidRequestError as exc:
        raise InvalidRequestError(
            f"invalid value for {name} in {where}: {exc.message}", hint=exc.hint,
            details={"key": name, "value": str(value), "source": where},
        ) from exc
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(
            f"invalid value for {name} in {where}: {exc}",
            hint="see docs/configuration.md for the expected form",
            details={"key": name, "value": str(value), "source": where},
        ) from exc


def _validate(s: Settings, sources: Mapping[str, str]) -> None:
    """Cross-field and range checks; the message names where the bad value came from."""

    def bad(name: str, why: str) -> InvalidRequestError:
        return InvalidRequestError(
            f"invalid {name} ({getattr(s, name)!r} from {sources.get(name, 'default')}): {why}",
            hint="see docs/configuration.md",
            details={"key": name, "source": sources.get(name, "default")},
        )

    if not 0 < s.memory_fraction <= 1:
        raise bad("memory_fraction", "must be in (0, 1]")
    if s.max_models < 1:
        raise bad("max_models", "must be at least 1")
    if s.ctx_floor < 256 or s.ctx_floor % 256:
        raise bad("ctx_floor", "must be a positive multiple of 256")
    if s.ctx_ceiling < s.ctx_floor or s.ctx_ceiling % 256:
        raise bad("ctx_ceiling", f"must be a multiple of 256 and >= ctx_floor ({s.ctx_floor})")
    if s.max_message_bytes < 64 * 1024:
        raise bad("max_message_bytes", "must be at least 64 KiB")
    for name in ("load_timeout_s", "queue_timeout_s", "runner_stall_s"):
        if not getattr(s, name) > 0:
            raise bad(name, "must be greater than 0")
    if s.failure_cooldown_s < 0:
        raise bad("failure_cooldown_s", "must not be negative")
    if s.threads is not None and s.threads < 1:
        raise bad("threads", "must be at least 1 (or 0/auto)")
    if s.max_queue < 1:
        raise bad("max_queue", "must be at least 1")
    if s.parallel is not None and not 1 <= s.parallel <= 64:
        raise bad("parallel", "must be between 1 and 64 (or 0/auto)")
    if not 0 <= s.prompt_cache_mib <= 1 << 20:
        raise bad("prompt_cache_mib", "must be between 0 (off) and 1048576")


def read_config_file(path: Path) -> dict[str, object]:
    """The raw table of a TOML config file (InvalidRequestError on a syntax error)."""
    import tomllib  # only when a config file exists

    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidRequestError(
            f"config file {path} is not valid TOML: {exc}",
            hint="fix the file or point MODELD_CONFIG elsewhere",
            details={"path": str(path)},
        ) from exc
    except OSError as exc:
        raise InvalidRequestError(
            f"cannot read config file {path}: {exc.strerror or exc}",
            hint="check the path given with --config or MODELD_CONFIG",
            details={"path": str(path)},
        ) from exc


def load_settings(
    cli_overrides: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    config_path: str | os.PathLike[str] | None = None,
) -> tuple[Settings, dict[str, str]]:
    """Build the settings and say where each came from.

    Sources are reported as ``"default"``, ``"config:<path>"``, ``"env:<VAR>"`` or ``"cli"``.
    ``cli_overrides`` values that are None are ignored (unset Typer options). The config file is
    ``config_path``, else ``$MODELD_CONFIG``, else the per-user default; only the default may be
    missing. Unknown keys anywhere raise :class:`InvalidRequestError` naming the key and source.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {name: "default" for name in _FIELDS}

    explicit = config_path is not None or bool(environ.get(CONFIG_ENV))
    if config_path is not None:
        cfg_path = Path(os.fspath(config_path)).expanduser()
    elif environ.get(CONFIG_ENV):
        cfg_path = Path(environ[CONFIG_ENV]).expanduser()
    else:
        cfg_path = paths.config_file()
    if explicit or cfg_path.is_file():
        where = f"config:{cfg_path}"
        for raw_key, raw_value in read_config_file(cfg_path).items():
            name = _canonical(raw_key)
            if name not in _FIELDS:
                raise _unknown_key(raw_key, f"config file {cfg_path}")
            values[name] = _convert(name, raw_value, f"config file {cfg_path}")
            sources[name] = where

    for name, var in ENV_VARS.items():
        raw = environ.get(var)
        if raw is not None and raw.strip() != "":
            values[name] = _convert(name, raw, f"environment variable {var}")
            sources[name] = f"env:{var}"

    for raw_key, raw_value in (cli_overrides or {}).items():
        if raw_value is None:
            continue
        name = _canonical(raw_key)
        if name not in _FIELDS:
            raise _unknown_key(raw_key, "command-line options")
        if name == "aliases" and "aliases" in values and isinstance(raw_value, Mapping):
            merged = dict(values["aliases"])
            merged.update(_parse_aliases(raw_value))
            values[name] = merged
        else:
            values[name] = _convert(name, raw_value, "command-line options")
        sources[name] = "cli"

    settings = Settings(**values)
    _validate(settings, sources)
    return settings, sources

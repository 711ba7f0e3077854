"""How a setting's text (config file, environment, flag) becomes its value: one parser per
kind of value, each raising ValueError with a message that says what form is expected.

Pure; :mod:`modeld.config` declares which setting uses which.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from modeld.cache.policy import parse_keep_alive

LOG_LEVELS = ("debug", "info", "warning", "error")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


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


def parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r} (use true/false, 1/0, yes/no, on/off)")


def parse_int(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError(f"not an integer: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return int(str(value).strip())


def parse_float(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError(f"not a number: {value!r}")
    result = float(value) if isinstance(value, int | float) else float(str(value).strip())
    if math.isnan(result):
        raise ValueError("not a number: nan")
    return result


def parse_path(value: object) -> Path:
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise ValueError(f"not a path: {value!r}")
    return Path(os.fspath(value)).expanduser()


def parse_socket(value: object) -> str:
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


def parse_optional_bytes(value: object) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "0")):
        return None
    result = parse_bytes(value)
    return result or None


def parse_optional_int(value: object) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto", "0")):
        return None
    result = parse_int(value)
    return result or None


def parse_auto_int(value: object) -> int | None:
    """``auto`` (or empty: None, derived elsewhere) or a whole number (0 included)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return None
    return parse_int(value)


def parse_keep_alive_text(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"not a keep-alive: {value!r}")
    parse_keep_alive(value)  # validates; raises InvalidRequestError
    return str(value).strip()


def parse_aliases(value: object) -> dict[str, str]:
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


def parse_mmproj(value: object) -> dict[str, str]:
    """``[mmproj]`` table: a model name (or path) -> its image projector file ("": none)."""
    if not isinstance(value, Mapping):
        raise ValueError('mmproj must be a table of name = "path"')
    out: dict[str, str] = {}
    for name, target in value.items():
        if not isinstance(target, str) or not str(name).strip():
            raise ValueError(f"mmproj of {name!r} must be a path string (\"\": none)")
        out[str(name).strip()] = target.strip()
    return out


def parse_rpc(value: object) -> dict[str, tuple[str, ...]]:
    """``[rpc]`` table: a model name (alias, models-dir name) -> its llama.cpp RPC workers,
    a list of "HOST:PORT" or one comma-separated string."""
    from modeld.errors import InvalidRequestError
    from modeld.rpc.endpoints import parse_endpoints

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


def parse_log_level(value: object) -> str:
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


def parse_http(value: object) -> str:
    text = str(value)
    return text.strip() if parse_http_address(text) else "off"


def parse_api_key(value: object) -> str | None:
    text = str(value).strip()
    return text or None


def parse_origins(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return tuple(str(i).strip().rstrip("/") for i in items if str(i).strip())


def parse_eviction(value: object) -> str:
    from modeld.cache.eviction import POLICIES

    text = str(value).strip().lower()
    if text not in POLICIES:
        raise ValueError(f"eviction must be one of {', '.join(POLICIES)}")
    return text


#: Who may use the HTTP front door over loopback (``http_users``): only the daemon's own user
#: (and root), other local users too when they send the api_key, or every local user.
HTTP_USERS = ("owner", "key", "all")


def parse_http_users(value: object) -> str:
    text = str(value).strip().lower()
    if text not in HTTP_USERS:
        raise ValueError(f"http_users must be one of {', '.join(HTTP_USERS)}")
    return text


def parse_kv_cache_type(value: object) -> str:
    """``f16``, ``q8_0`` or ``q4_0`` (kvcache.KV_CACHE_TYPES; case and ``-`` forgiven)."""
    from modeld.model.kvcache import KV_CACHE_TYPES

    text = str(value).strip().lower().replace("-", "_")
    if text not in KV_CACHE_TYPES:
        raise ValueError(f"KV cache type must be one of {', '.join(KV_CACHE_TYPES)}")
    return text


def parse_gpu_layers(value: object) -> int | None:
    """``auto`` (None: as many layers as fit the cards' free VRAM), or a count (0: CPU only;
    more than the model has: all). A negative count is ``auto``, as Ollama's ``num_gpu`` -1."""
    if value is None or str(value).strip().lower() in ("", "auto"):
        return None
    if isinstance(value, bool):
        raise ValueError("gpu layers must be auto or a number of layers")
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ValueError("gpu layers must be auto or a number of layers") from None
    return None if n < 0 else n


#: what a ``[model_options.NAME]`` table may set, and how each value is read
MODEL_OPTIONS: dict[str, Callable[[object], object]] = {
    "kv_cache_type": parse_kv_cache_type, "gpu_layers": parse_gpu_layers,
    "kv_unified": parse_bool,
}


def model_option_names(last: str = ", ") -> str:
    """The keys of :data:`MODEL_OPTIONS` as a list for help and errors (``last`` joins the
    final two: ``" and "`` for prose)."""
    *rest, final = MODEL_OPTIONS
    return last.join((", ".join(rest), final)) if rest else final


def parse_model_options(value: object) -> dict[str, dict[str, object]]:
    """``[model_options.NAME]`` tables: per model name (alias, models-dir name), its own
    values of :data:`MODEL_OPTIONS`."""
    if not isinstance(value, Mapping):
        raise ValueError("model_options must be a table of [model_options.NAME] tables")
    out: dict[str, dict[str, object]] = {}
    for name, opts in value.items():
        if not isinstance(opts, Mapping) or not str(name).strip():
            raise ValueError(
                f"model_options entry {name!r} must be a table ({model_option_names()})")
        row: dict[str, object] = {}
        for key, raw in opts.items():
            parse = MODEL_OPTIONS.get(str(key).replace("-", "_"))
            if parse is None:
                raise ValueError(f"model_options entry {name!r}: unknown option {key!r} (known: "
                                 f"{model_option_names()})")  # fmt: skip
            try:
                row[str(key).replace("-", "_")] = parse(raw)
            except ValueError as exc:
                raise ValueError(f"model_options entry {name!r}: {exc}") from exc
        out[str(name).strip()] = row
    return out

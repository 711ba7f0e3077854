"""Every filesystem location modeld uses, in one place, each with an environment override.

| what         | env override          | default                                   |
|--------------|-----------------------|-------------------------------------------|
| runtime dir  | ``MODELD_RUNTIME_DIR`` | ``<user runtime dir>/modeld`` (mode 0700) |
| socket       | ``MODELD_SOCKET``      | ``ipc://<runtime dir>/modeld.sock``       |
| config file  | ``MODELD_CONFIG``      | ``<user config dir>/modeld/config.toml``  |
| log dir      | ``MODELD_LOG_DIR``     | ``<user log dir>/modeld``                 |
| models dir   | ``MODELD_MODELS``      | ``<user data dir>/modeld/models``         |
| prompt cache | ``MODELD_PROMPT_CACHE_DIR`` | ``<user cache dir>/modeld/prompts`` (0700) |

platformdirs is imported lazily so pure modules can import this one cheaply.
"""

from __future__ import annotations

import os
from pathlib import Path

APP = "modeld"


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def runtime_dir() -> Path:
    """Per-user directory for the socket and lock file (not created here)."""
    override = _env_path("MODELD_RUNTIME_DIR")
    if override is not None:
        return override
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / APP
    # No XDG runtime dir (containers, CI, root shells): a per-uid dir under the temp dir.
    import tempfile  # lazily: it costs ~8 ms of the fast CLI path's start-up (modeld.cli.entry)

    return Path(tempfile.gettempdir()) / f"{APP}-{os.getuid()}"


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` with mode 0700; an existing one is tightened only if it is modeld's own
    runtime dir. A socket put in a shared directory (``/tmp``, a home directory) must not take
    that directory from everyone else: the daemon makes the socket itself 0600."""
    import stat

    try:
        path.mkdir(mode=0o700, parents=True)
        return path
    except FileExistsError:
        if not path.is_dir():
            raise
    st = path.stat()
    if (
        st.st_uid == os.getuid()
        and st.st_mode & 0o077
        and not st.st_mode & stat.S_ISVTX  # /tmp and its kind are shared by design
        and path == runtime_dir()
    ):
        path.chmod(0o700)
    return path


def socket_endpoint() -> str:
    """ZeroMQ endpoint the daemon binds and clients connect to."""
    override = os.environ.get("MODELD_SOCKET")
    if override:
        return override if "://" in override else f"ipc://{Path(override).expanduser()}"
    return f"ipc://{runtime_dir() / 'modeld.sock'}"


def ipc_path(endpoint: str) -> Path | None:
    """The filesystem path behind an ``ipc://`` endpoint, else None."""
    return Path(endpoint[len("ipc://"):]) if endpoint.startswith("ipc://") else None


def lock_file(endpoint: str | None = None) -> Path:
    """Lock file that keeps a second daemon off the same socket."""
    sock = ipc_path(endpoint or socket_endpoint())
    if sock is not None:
        return sock.with_name(sock.name + ".lock")
    return runtime_dir() / "modeld.lock"


def config_file() -> Path:
    override = _env_path("MODELD_CONFIG")
    if override is not None:
        return override
    import platformdirs

    return Path(platformdirs.user_config_dir(APP)) / "config.toml"


def log_dir() -> Path:
    override = _env_path("MODELD_LOG_DIR")
    if override is not None:
        return override
    import platformdirs

    return Path(platformdirs.user_log_dir(APP))


def models_dir() -> Path:
    override = _env_path("MODELD_MODELS")
    if override is not None:
        return override
    import platformdirs

    return Path(platformdirs.user_data_dir(APP)) / "models"


def prompt_cache_dir() -> Path:
    """Where runners keep an evicted model's prompt snapshots (runner/promptfile.py)."""
    override = _env_path("MODELD_PROMPT_CACHE_DIR")
    if override is not None:
        return override
    import platformdirs

    return Path(platformdirs.user_cache_dir(APP)) / "prompts"


def default_model_dir() -> Path:
    """Where the built-in default model's file is assembled: the user cache dir, which honours
    ``XDG_CACHE_HOME`` (the model package's own default is ``~/.cache/<package>`` always)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir(APP)) / "default-model"

"""llama.cpp's log in Python logging, for the runner process (split from :mod:`modeld.runner`).

llama.cpp and ggml print through a callback; without one their lines go to stderr unformatted,
and llama-cpp-python's ``verbose=False`` points fds 1/2 at /dev/null during a load, which would
also hide the message of a native abort. :func:`install_llama_logging` fixes both.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from typing import Any

import llama_cpp
import llama_cpp._internals
import llama_cpp.llama

# ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the last message
_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
llama_logger = logging.getLogger("llama.cpp")
_log_state: dict[str, Any] = {"buf": "", "level": logging.DEBUG, "capture": None, "file": None}


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
def _llama_log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """Route llama.cpp/ggml log lines into Python logging (lines arrive in pieces)."""
    if level != 5:  # 5 = continuation of the previous message
        _log_state["level"] = _LEVELS.get(level, logging.DEBUG)
    _log_state["buf"] += text.decode("utf-8", errors="replace")
    while "\n" in _log_state["buf"]:
        line, _log_state["buf"] = _log_state["buf"].split("\n", 1)
        if line.strip():
            llama_logger.log(_log_state["level"], "%s", line)
            if _log_state["capture"] is not None:
                _log_state["capture"].append(line)
            if _log_state["file"] is not None:
                with contextlib.suppress(OSError):
                    os.write(_log_state["file"], line.encode("utf-8", "replace") + b"\n")


def log_callback() -> Any:
    """The callback that routes native log lines here (libmtmd takes the same one)."""
    return _llama_log_callback


def capture_start(path: str | None = None) -> None:
    """Keep llama.cpp's log lines from now on (a load's device buffers are read from them);
    with ``path``, also write each line there at once (unbuffered): should llama.cpp kill the
    process, the daemon reads the load's last lines from that file (daemon/crashinfo.py)."""
    _log_state["capture"] = []
    if path is not None:
        with contextlib.suppress(OSError):
            _log_state["file"] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)


def capture_stop() -> list[str]:
    """The lines kept since :func:`capture_start` (and stop keeping them)."""
    lines: list[str] = _log_state["capture"] or []
    _log_state["capture"] = None
    fd, _log_state["file"] = _log_state["file"], None
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
    return lines


class _NoSuppress:
    """Stand-in for llama-cpp-python's stdout/stderr redirection (see install_llama_logging)."""

    def __init__(self, disable: bool = True) -> None:
        self.disable = disable

    def __enter__(self) -> _NoSuppress:
        return self

    def __exit__(self, *_: object) -> None:
        return None


def install_llama_logging() -> None:
    """Send llama.cpp's log through logging, and stop llama-cpp-python from pointing fds 1/2 at
    /dev/null during a load (verbose=False does that): a native abort while loading a bad file
    then still leaves its message in the runner log."""
    llama_cpp.llama_log_set(_llama_log_callback, ctypes.c_void_p(0))
    llama_cpp.llama.suppress_stdout_stderr = _NoSuppress  # type: ignore[attr-defined,assignment]
    llama_cpp._internals.suppress_stdout_stderr = _NoSuppress  # type: ignore[attr-defined,assignment]

"""Why the daemon's ipc socket cannot be used, as one typed error with a hint.

Standard library only (``_socket``, not :mod:`socket`, whose import costs ~5 ms) because the fast
CLI path calls it before every request. ZeroMQ connects to an ipc path lazily and retries
forever, so a missing file, a directory the user may not enter, a file that is no socket or a
socket nobody listens on would otherwise all look like a daemon that never answers.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False  # typing's import costs ~2 ms; mypy treats this name as typing's
if TYPE_CHECKING:
    from modeld.errors import DaemonUnavailableError

START_HINT = "start it with `modeld serve` (or let `modeld run` start it)"


def socket_problem(path: str) -> DaemonUnavailableError | None:
    """None when a daemon accepts connections at ``path``; else what is wrong and what to do."""
    import _socket

    try:
        st = os.stat(path)
    except FileNotFoundError:
        return _error(f"daemon not running (no socket at {path})", START_HINT, "missing")
    except PermissionError:
        return _denied(path)
    except OSError as exc:
        return _error(f"cannot use the daemon socket {path}: {exc.strerror}",
                      "check MODELD_SOCKET / the `socket` setting (`modeld config`)", "os_error")
    if not stat.S_ISSOCK(st.st_mode):
        return _error(f"{path} is not a socket", "remove that file or point MODELD_SOCKET "
                      "elsewhere, then `modeld serve`", "not_a_socket")
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except PermissionError:
        return _denied(path)
    except ConnectionRefusedError:
        return _error(f"daemon not running (stale socket at {path}, nothing listens)",
                      START_HINT, "refused")
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            return None  # a listener with a full backlog: it is there
        return _error(f"cannot connect to the daemon socket {path}: {exc.strerror}",
                      START_HINT, "os_error")
    finally:
        sock.close()
    return None


def _denied(path: str) -> DaemonUnavailableError:
    return _error(
        f"permission denied on the daemon socket {path}",
        "it belongs to another user (modeld's socket directory is private): run modeld as that "
        "user, or start your own daemon with `modeld serve` on a socket of yours (MODELD_SOCKET)",
        "permission",
    )


def _error(message: str, hint: str, reason: str) -> DaemonUnavailableError:
    from modeld.errors import DaemonUnavailableError

    return DaemonUnavailableError(message, hint=hint, details={"reason": reason})

"""Domain errors, their stable wire codes, and the CLI exit codes they map to.

The library raises these; only the CLI edge turns them into exit codes and messages.
Every error says what went wrong *and* what to do next (``hint``).
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class ErrorCode(StrEnum):
    """Stable error codes carried on the wire (protocol ``error`` replies)."""

    MODEL_NOT_FOUND = "model_not_found"
    INVALID_MODEL = "invalid_model"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    INVALID_REQUEST = "invalid_request"
    RUNNER_CRASHED = "runner_crashed"
    CANCELLED = "cancelled"
    PROTOCOL_MISMATCH = "protocol_mismatch"
    TIMEOUT = "timeout"
    DAEMON_UNAVAILABLE = "daemon_unavailable"
    CONTEXT_EXCEEDED = "context_exceeded"
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal"
    UNAUTHORIZED = "unauthorized"
    NETWORK = "network"
    DISK_FULL = "disk_full"
    VERIFICATION_FAILED = "verification_failed"
    RPC_WORKER = "rpc_worker"


class ExitCode(IntEnum):
    """Named process exit codes (documented in the README and man page)."""

    OK = 0
    ERROR = 1
    USAGE = 2
    DAEMON_UNAVAILABLE = 3
    MODEL_NOT_FOUND = 4
    INVALID_MODEL = 5
    INSUFFICIENT_MEMORY = 6
    RUNNER_CRASHED = 7
    TIMEOUT = 8
    CONTEXT_EXCEEDED = 9
    UNAUTHORIZED = 10
    NETWORK = 11
    DISK_FULL = 12
    VERIFICATION_FAILED = 13
    RPC_WORKER = 14
    INVALID_REPLY = 15  # `run --format`: the reply was printed, but fails its schema
    INTERRUPTED = 130


class ModeldError(Exception):
    """Base of every error modeld raises on purpose."""

    code: ErrorCode = ErrorCode.INTERNAL
    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str, *, hint: str = "", details: dict[str, object] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details: dict[str, object] = dict(details or {})

    def __str__(self) -> str:
        return f"{self.message} — {self.hint}" if self.hint else self.message

    def to_dict(self) -> dict[str, object]:
        """The wire/JSON form: code, message, hint, details."""
        return {
            "code": self.code.value,
            "message": self.message,
            "hint": self.hint,
            "details": self.details,
        }


class ModelNotFoundError(ModeldError):
    code = ErrorCode.MODEL_NOT_FOUND
    exit_code = ExitCode.MODEL_NOT_FOUND


class InvalidModelError(ModeldError):
    """The file exists but is not a usable GGUF model (truncated, corrupt, unsupported)."""

    code = ErrorCode.INVALID_MODEL
    exit_code = ExitCode.INVALID_MODEL


class InsufficientMemoryError(ModeldError):
    code = ErrorCode.INSUFFICIENT_MEMORY
    exit_code = ExitCode.INSUFFICIENT_MEMORY


class InvalidRequestError(ModeldError):
    code = ErrorCode.INVALID_REQUEST
    exit_code = ExitCode.USAGE


class ContextExceededError(ModeldError):
    """The prompt does not fit any context this model can get (training limit or memory)."""

    code = ErrorCode.CONTEXT_EXCEEDED
    exit_code = ExitCode.CONTEXT_EXCEEDED


class RunnerCrashedError(ModeldError):
    code = ErrorCode.RUNNER_CRASHED
    exit_code = ExitCode.RUNNER_CRASHED


class CancelledError(ModeldError):
    code = ErrorCode.CANCELLED
    exit_code = ExitCode.INTERRUPTED


class ShuttingDownError(ModeldError):
    code = ErrorCode.SHUTTING_DOWN
    exit_code = ExitCode.DAEMON_UNAVAILABLE


class ProtocolMismatchError(ModeldError):
    code = ErrorCode.PROTOCOL_MISMATCH
    exit_code = ExitCode.ERROR


class RequestTimeoutError(ModeldError):
    code = ErrorCode.TIMEOUT
    exit_code = ExitCode.TIMEOUT


class DaemonUnavailableError(ModeldError):
    code = ErrorCode.DAEMON_UNAVAILABLE
    exit_code = ExitCode.DAEMON_UNAVAILABLE


class UnauthorizedError(ModeldError):
    """The hub refused the download: a gated or private repository, or a bad token."""

    code = ErrorCode.UNAUTHORIZED
    exit_code = ExitCode.UNAUTHORIZED


class NetworkError(ModeldError):
    """The hub could not be reached, the connection kept failing, or offline mode is on."""

    code = ErrorCode.NETWORK
    exit_code = ExitCode.NETWORK


class DiskFullError(ModeldError):
    """Not enough free disk for a download (checked first, or hit while writing)."""

    code = ErrorCode.DISK_FULL
    exit_code = ExitCode.DISK_FULL


class VerificationError(ModeldError):
    """A downloaded file's SHA-256 is not the one the hub published; the file was deleted."""

    code = ErrorCode.VERIFICATION_FAILED
    exit_code = ExitCode.VERIFICATION_FAILED


class RpcWorkerError(ModeldError):
    """A llama.cpp RPC worker cannot be used: unreachable, busy (leased to another model or
    serving another client), another protocol version, or lost mid-request. ``details``
    names the ``endpoint`` and the ``problem``."""

    code = ErrorCode.RPC_WORKER
    exit_code = ExitCode.RPC_WORKER


_BY_CODE: dict[str, type[ModeldError]] = {
    cls.code.value: cls
    for cls in (
        ModelNotFoundError,
        InvalidModelError,
        InsufficientMemoryError,
        InvalidRequestError,
        ContextExceededError,
        RunnerCrashedError,
        CancelledError,
        ShuttingDownError,
        ProtocolMismatchError,
        RequestTimeoutError,
        DaemonUnavailableError,
        UnauthorizedError,
        NetworkError,
        DiskFullError,
        VerificationError,
        RpcWorkerError,
    )
}


def error_from_dict(data: dict[str, object]) -> ModeldError:
    """Rebuild a typed error from its wire form (unknown codes become a plain ModeldError)."""
    cls = _BY_CODE.get(str(data.get("code", "")), ModeldError)
    details = data.get("details")
    err = cls(
        str(data.get("message", "unknown error")),
        hint=str(data.get("hint", "") or ""),
        details=details if isinstance(details, dict) else None,
    )
    return err


def unusable_path(exc: OSError, setting: str) -> InvalidRequestError:
    """An OSError on a path modeld must create or open (a log or runtime directory, a socket):
    one line naming the path and the setting that chose it, instead of a traceback."""
    path = exc.filename if exc.filename is not None else "?"
    return InvalidRequestError(
        f"cannot use {path} ({setting}): {exc.strerror or exc}",
        hint=f"point {setting} elsewhere (`modeld config` shows where it is set), or fix "
        "that path (a file where a directory belongs, or permissions)",
        details={"path": str(path), "setting": setting, "errno": exc.errno},
    )


def format_bytes(n: float) -> str:
    """Human-readable binary size, e.g. ``241.0 MiB``; used in error messages."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - loop always returns


def clip(text: str, most: int = 200) -> str:
    """``text`` cut to ``most`` characters for a message: what a caller sent (a 100 KB path,
    a header) is never echoed whole."""
    return text if len(text) <= most else f"{text[:most]}… ({len(text)} characters)"

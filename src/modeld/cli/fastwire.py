"""The fast CLI path's wire to the daemon: endpoint, JSON and ZeroMQ without heavy imports.

Split from :mod:`modeld.cli.entry` (which uses it for ``run``, ``load`` and ``ps``). Everything
here mirrors a slower module and is checked against it by tests/test_entry.py: the endpoint and
config path rules mirror :mod:`modeld.paths` (and platformdirs) without pathlib; the JSON
helpers mirror :mod:`json` with its C scanner only; messages are built, and replies read, by
:mod:`modeld.wire.replyflow` as in :mod:`modeld.client` (protocol v1, docs/protocol.md). libzmq is
used through ctypes (the copy pyzmq ships, or the system one), falling back to pyzmq.
"""

from __future__ import annotations

import os
import sys

from modeld.wire.replyflow import ReplyStream, envelope

TYPE_CHECKING = False  # typing's import costs ~2 ms; mypy treats this name as typing's
if TYPE_CHECKING:
    from collections.abc import Callable

_ZMQ_DEALER, _ZMQ_LINGER, _ZMQ_RCVTIMEO = 5, 17, 27  # zmq.h
_WAIT_S = 5.0  # then give the request to the full CLI (which waits as long as needed)


class _Fallthrough(Exception):
    """The fast path cannot answer this one; the full CLI will."""


# ---------------------------------------------------------------------- endpoint


def _endpoint() -> str:
    """The daemon endpoint exactly as config.load_settings would find it, or _Fallthrough.

    Order: ``MODELD_SOCKET`` > ``socket`` in the config file > the default. A config file that
    cannot be parsed, or that sets anything the full CLI must validate for the socket, goes to
    the full CLI so its error message is the one the user sees.
    """
    if os.environ.get("MODELD_SOCKET", "").strip():
        return _socket_endpoint()
    cfg = os.environ.get("MODELD_CONFIG")
    cfg_path = os.path.expanduser(cfg) if cfg else _default_config_file()
    try:
        size = os.stat(cfg_path).st_size
    except OSError:
        if cfg:  # an explicit config file that is missing is an error in the full CLI
            raise _Fallthrough from None
        return _socket_endpoint()
    if size:
        import tomllib

        try:
            with open(cfg_path, "rb") as fh:
                table = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError):
            raise _Fallthrough from None
        if "socket" in table:
            raise _Fallthrough
    return _socket_endpoint()


def _socket_endpoint() -> str:
    """paths.socket_endpoint() without importing pathlib (~9 ms with the re, fnmatch and
    urllib it pulls in) in the usual cases; anything unusual asks modeld.paths. A test checks
    both name the same socket."""
    override = os.environ.get("MODELD_SOCKET")
    runtime = os.environ.get("MODELD_RUNTIME_DIR")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if any(v and ".." in v for v in (override, runtime, xdg)):
        base = None  # Path keeps "..", normpath would fold it: let paths decide
    elif override:
        if "://" in override:
            if override.startswith(("ipc://", "tcp://")) and len(override) > 6:
                return override
            raise _Fallthrough  # nothing sent yet: the full CLI says what is wrong with it
        return "ipc://" + os.path.normpath(os.path.expanduser(override))
    elif runtime:
        base = os.path.expanduser(runtime)
    elif xdg and os.path.isdir(xdg):
        base = os.path.join(xdg, "modeld")
    else:
        base = None  # the temp-dir fallback: tempfile is imported there anyway
    if base is None or not base.startswith("/"):
        from modeld import paths

        return paths.socket_endpoint()
    return "ipc://" + os.path.normpath(os.path.join(base, "modeld.sock"))


def _default_config_file() -> str:
    """paths.config_file() without importing platformdirs (~14 ms) where its rule is plain:
    on Linux with an absolute (or unset) HOME it is ``$XDG_CONFIG_HOME`` (when absolute) or
    ``~/.config``, then ``modeld/config.toml``. A test checks both agree."""
    home = os.environ.get("HOME")
    if sys.platform.startswith("linux") and (home is None or home.startswith("/")):
        xdg = os.environ.get("XDG_CONFIG_HOME", "")
        base = xdg if xdg.startswith("/") else os.path.expanduser("~/.config")
        return os.path.join(base, "modeld", "config.toml")
    from modeld import paths

    return str(paths.config_file())


# ---------------------------------------------------------------------- JSON

# The json package costs ~6 ms to import (json.decoder pulls in re and enum); its C scanner and
# string encoder alone cost nothing. A test checks these agree with json.dumps/json.loads.


class _ScanContext:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        raise ValueError(f"non-finite number {name} in a reply")


def loads(data: bytes) -> object:
    """json.loads for one reply frame."""
    try:
        import _json
    except ImportError:  # pragma: no cover - not CPython
        import json

        return json.loads(data)
    text = data.decode("utf-8")
    start = len(text) - len(text.lstrip())
    try:
        value, end = _json.make_scanner(_ScanContext)(text, start)  # type: ignore[arg-type]
    except StopIteration:
        raise ValueError("not a JSON value") from None
    if text[end:].strip():
        raise ValueError("trailing data after the JSON value")
    return value


def dumps(value: object) -> str:
    """json.dumps(value, separators=(",", ":"), allow_nan=False) for request bodies."""
    try:
        from _json import encode_basestring_ascii as enc
    except ImportError:  # pragma: no cover - not CPython
        import json

        return json.dumps(value, separators=(",", ":"), allow_nan=False)

    def go(v: object) -> str:
        if isinstance(v, str):
            return str(enc(v))
        if v is None:
            return "null"
        if v is True:
            return "true"
        if v is False:
            return "false"
        if isinstance(v, int):
            return int.__repr__(v)
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise ValueError("non-finite float")
            return float.__repr__(v)
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(go(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ",".join(f"{go(str(k))}:{go(x)}" for k, x in v.items()) + "}"
        raise TypeError(f"cannot encode {type(v).__name__}")

    return go(value)


# ---------------------------------------------------------------------- transports


def _find_libzmq() -> str | None:
    """The libzmq that pyzmq's wheel bundles (``site-packages/pyzmq.libs``), if any."""
    for entry in sys.path:
        libs = os.path.join(entry or ".", "pyzmq.libs")
        try:
            names = os.listdir(libs)
        except OSError:
            continue
        for name in names:
            if name.startswith("libzmq") and ".so" in name:
                return os.path.join(libs, name)
    return None


class _CtypesConn:
    """A DEALER socket through libzmq's C API (no pyzmq import)."""

    def __init__(self, endpoint: str) -> None:
        import ctypes

        try:
            lib = ctypes.CDLL(_find_libzmq() or "libzmq.so.5")
        except OSError:
            raise ImportError("libzmq not found") from None
        vp, cint = ctypes.c_void_p, ctypes.c_int
        lib.zmq_ctx_new.restype = vp
        lib.zmq_socket.restype = vp
        lib.zmq_socket.argtypes = [vp, cint]
        lib.zmq_setsockopt.argtypes = [vp, cint, vp, ctypes.c_size_t]
        lib.zmq_connect.argtypes = [vp, ctypes.c_char_p]
        lib.zmq_send.argtypes = [vp, ctypes.c_char_p, ctypes.c_size_t, cint]
        lib.zmq_msg_init.argtypes = [vp]
        lib.zmq_msg_recv.argtypes = [vp, vp, cint]
        lib.zmq_msg_data.restype = vp
        lib.zmq_msg_data.argtypes = [vp]
        lib.zmq_msg_size.restype = ctypes.c_size_t
        lib.zmq_msg_size.argtypes = [vp]
        lib.zmq_msg_close.argtypes = [vp]
        lib.zmq_close.argtypes = [vp]
        lib.zmq_ctx_term.argtypes = [vp]
        self._c, self._lib = ctypes, lib
        self._ctx = lib.zmq_ctx_new()
        self._sock = lib.zmq_socket(self._ctx, _ZMQ_DEALER)
        self._timeout = -2
        zero = cint(0)
        lib.zmq_setsockopt(self._sock, _ZMQ_LINGER, ctypes.byref(zero), 4)
        self._msg = ctypes.create_string_buffer(64)  # zmq_msg_t
        if lib.zmq_connect(self._sock, endpoint.encode()) != 0:
            self.close()
            raise _Fallthrough

    def send(self, data: bytes) -> None:
        if self._lib.zmq_send(self._sock, data, len(data), 0) < 0:
            raise _Fallthrough

    def recv(self, timeout_ms: int) -> bytes | None:
        lib, c = self._lib, self._c
        if timeout_ms != self._timeout:
            t = c.c_int(timeout_ms)
            lib.zmq_setsockopt(self._sock, _ZMQ_RCVTIMEO, c.byref(t), 4)
            self._timeout = timeout_ms
        lib.zmq_msg_init(self._msg)
        try:
            if lib.zmq_msg_recv(self._msg, self._sock, 0) < 0:
                return None  # EAGAIN after the timeout (or EINTR)
            data: bytes = c.string_at(lib.zmq_msg_data(self._msg), lib.zmq_msg_size(self._msg))
            return data
        finally:
            lib.zmq_msg_close(self._msg)

    def close(self) -> None:
        if self._sock is not None:
            self._lib.zmq_close(self._sock)
            self._lib.zmq_ctx_term(self._ctx)
            self._sock = None


class _PyzmqConn:
    """The same on pyzmq (when libzmq cannot be loaded through ctypes)."""

    def __init__(self, endpoint: str) -> None:
        import zmq

        self._zmq = zmq
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)

    def send(self, data: bytes) -> None:
        self._sock.send(data)

    def recv(self, timeout_ms: int) -> bytes | None:
        if self._sock.poll(timeout_ms, self._zmq.POLLIN):
            data: bytes = self._sock.recv()
            return data
        return None

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()


def _alive(endpoint: str) -> bool:
    """A daemon accepts connections at an ipc endpoint (tcp ones are taken on trust)."""
    if not endpoint.startswith("ipc://"):
        return True
    from modeld.socketcheck import socket_problem

    return socket_problem(endpoint[len("ipc://") :]) is None


def _gone() -> Exception:
    from modeld.errors import DaemonUnavailableError

    return DaemonUnavailableError(
        "the daemon went away while this request was running",
        hint="see the daemon log (`modeld config` shows where) and start it again with "
        "`modeld serve`",
    )


class FastSession:
    """One connection to the daemon for one command: send requests, read their replies.

    ``MODELD_FAST_TRANSPORT=pyzmq`` forces the pyzmq transport (used by the benchmarks).
    Raises _Fallthrough when there is no daemon to talk to.
    """

    def __init__(self, endpoint: str | None = None) -> None:
        self.endpoint = endpoint or _endpoint()
        if not _alive(self.endpoint):
            raise _Fallthrough
        self._n = 0
        self.conn: _CtypesConn | _PyzmqConn
        if os.environ.get("MODELD_FAST_TRANSPORT") == "pyzmq":
            self.conn = _PyzmqConn(self.endpoint)
        else:
            try:
                self.conn = _CtypesConn(self.endpoint)
            except ImportError:
                self.conn = _PyzmqConn(self.endpoint)

    def send(self, type_: str, **body: object) -> ReplyStream:
        """Send a request (None values left out, as protocol.request does); its replies."""
        self._n += 1
        rid = f"fast-{os.getpid():x}-{self._n}"
        msg = envelope(type_, rid, {k: v for k, v in body.items() if v is not None})
        self.conn.send(dumps(msg).encode())
        return ReplyStream(rid)

    def recv(
        self, replies: ReplyStream, wait_s: float | None = _WAIT_S,
        tick: Callable[[], None] | None = None,
    ) -> tuple[str, dict[str, object]]:
        """The next chunk or the done of ``replies``' request; an error reply raises its
        typed error.

        The request is already sent, so nothing here hands over to the full CLI (which would
        send it again): a vanished daemon, a reply past ``wait_s`` or a malformed reply is a
        typed error. ``wait_s=None`` waits as long as the daemon is there (a generation or a
        load); ``tick`` is called about every 250 ms while waiting.
        """
        import time

        deadline = None if wait_s is None else time.monotonic() + wait_s
        marker = f'"id":"{replies.request_id}"'.encode()
        while True:
            data = self.conn.recv(250)
            if data is None:
                if not _alive(self.endpoint):
                    raise _gone()
                if tick is not None:
                    tick()
                if deadline is not None and time.monotonic() > deadline:
                    from modeld.errors import RequestTimeoutError

                    raise RequestTimeoutError(
                        f"no reply from the daemon within {wait_s:g} s",
                        hint="check the daemon log (`modeld config` shows where); "
                        "restart it with `modeld stop` and `modeld serve`",
                    )
                continue
            if marker not in data:
                continue  # a late reply to something else: not worth parsing
            try:
                reply = loads(data)
            except ValueError:
                reply = {"id": replies.request_id}  # ours, unreadable: the stream says so
            if (event := replies.feed(reply)) is not None:
                return event

    def close(self) -> None:
        self.conn.close()


def request(type_: str, endpoint: str | None = None, wait_s: float = _WAIT_S) -> dict[str, object]:
    """Send one body-less request (``ps``, ``ping``, ...) and return the ``done`` reply body.

    Raises _Fallthrough only before sending (no daemon); after, an error reply or a failed
    exchange is a typed error (:mod:`modeld.errors`).
    """
    session = FastSession(endpoint)
    try:
        replies = session.send(type_)
        while True:
            kind, body = session.recv(replies, wait_s)
            if kind == "done":
                return body
    finally:
        session.close()

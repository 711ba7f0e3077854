"""The ``modeld`` console script: fast paths for run, load, ps, --help and --version.

Why: every shell call pays the CLI's start-up. The Typer app (cli.py) costs 60-200 ms of imports
before it does anything (Typer/click ~50 ms, modeld.config ~30 ms, pyzmq's Python layer 25-40
ms; ``python -X importtime``), several times a bare ``python -c pass`` and, for ``modeld run``
on a warm model, more than the generation itself. This module serves the hot commands with the
standard library only and falls through to :func:`modeld.cli.main` for everything else and for
any case it is not sure about (an option it does not know, one positional argument to ``run``,
a config file that sets the socket, no daemon, an error before any output), so usage and
errors are always reported by the one real CLI. docs/benchmarks.md has the measurements.

The daemon is reached over ZeroMQ through libzmq itself via ctypes (the libzmq that pyzmq
ships, or the system one), which skips pyzmq's Python import; if libzmq cannot be loaded the
same exchange runs on pyzmq. The wire messages are protocol v1 (docs/protocol.md), built as
client.py builds them.

The ``--help`` text is pre-rendered from the Typer app into :mod:`modeld._help` (a test keeps
it fresh; regenerate with ``python -m modeld.entry --write-help``) and used only when click
would render it at its full width of 80 columns.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing's import costs ~2 ms; mypy treats this name as typing's
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

#: protocol.PROTOCOL_VERSION (a test checks they agree; protocol.py itself is too costly here)
PROTOCOL_VERSION = 1
HELP_WIDTH = 80  # click renders help at min(terminal columns, 80)
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
            return override
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
    return not endpoint.startswith("ipc://") or os.path.exists(endpoint[len("ipc://") :])


class Session:
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

    def send(self, type_: str, **body: object) -> str:
        """Send a request (None values left out, as protocol.request does); its id."""
        self._n += 1
        rid = f"fast-{os.getpid():x}-{self._n}"
        msg = {k: v for k, v in body.items() if v is not None}
        msg.update(v=PROTOCOL_VERSION, id=rid, type=type_)
        self.conn.send(dumps(msg).encode())
        return rid

    def recv(
        self, rid: str, wait_s: float | None = _WAIT_S, tick: Callable[[], None] | None = None
    ) -> dict[str, object]:
        """The next reply (chunk/done/error) for ``rid``; _Fallthrough when none comes.

        ``wait_s=None`` waits as long as the daemon is there (a generation or a load);
        ``tick`` is called about every 250 ms while waiting.
        """
        import time

        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            data = self.conn.recv(250)
            if data is None:
                if not _alive(self.endpoint):
                    raise _Fallthrough
                if tick is not None:
                    tick()
                if deadline is not None and time.monotonic() > deadline:
                    raise _Fallthrough
                continue
            if f'"id":"{rid}"'.encode() not in data:
                continue  # a late reply to something else
            try:
                reply = loads(data)
            except ValueError:
                raise _Fallthrough from None
            if (
                isinstance(reply, dict)
                and reply.get("id") == rid
                and reply.get("v") == PROTOCOL_VERSION
                and reply.get("type") in ("chunk", "done", "error")
            ):
                return reply
            raise _Fallthrough

    def close(self) -> None:
        self.conn.close()


def request(type_: str, endpoint: str | None = None, wait_s: float = _WAIT_S) -> dict[str, object]:
    """Send one body-less request (``ps``, ``ping``, ...) and return the ``done`` reply body.

    Raises _Fallthrough for anything but a ``done`` reply in time (no daemon, error reply).
    """
    session = Session(endpoint)
    try:
        reply = session.recv(session.send(type_), wait_s)
    finally:
        session.close()
    if reply.get("type") != "done":
        raise _Fallthrough
    return {k: v for k, v in reply.items() if k not in ("v", "id", "type")}


# ---------------------------------------------------------------------- ps


def ps_text(models: list[dict[str, object]], now: float) -> str:
    """The ``ps`` table: modeld.pstable, the one implementation (stdlib only, no rich)."""
    from modeld import pstable

    return pstable.text(models, now, width=_columns())


def _ps(json_out: bool) -> None:
    import time

    reply = request("ps")
    models = reply.get("models")
    if not isinstance(models, list):
        raise _Fallthrough
    if json_out:  # render.to_json's shape
        import json

        doc = {"schema_version": 1, "kind": "ps", "models": models}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(ps_text(models, time.time()))
    sys.stdout.flush()


# ---------------------------------------------------------------------- run / load

#: Options the fast ``run`` understands (name -> converter; None = a flag). Anything else
#: (--json, --verbose, --help, a chat on a terminal, one positional argument) goes to the full CLI.
_RUN_OPTS: dict[str, Callable[[str], object] | None] = {
    "--system": str,
    "--max-tokens": int,
    "--temperature": float,
    "--top-p": float,
    "--top-k": int,
    "--seed": int,
    "--stop": str,
    "--keep-alive": str,
    "--ctx": int,
    "--raw": None,
}
_LOAD_OPTS: dict[str, Callable[[str], object] | None] = {
    "--ctx": int,
    "--keep-alive": str,
    "--pin": None,
    "--embed": None,
    "--json": None,
}


def _parse(
    args: list[str], spec: Mapping[str, Callable[[str], object] | None]
) -> tuple[list[str], dict[str, object]]:
    """Positionals and options like click would parse them; _Fallthrough when unsure."""
    pos: list[str] = []
    opts: dict[str, object] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            pos.extend(args[i + 1 :])
            break
        if arg.startswith("-") and arg != "-":
            name, eq, inline = arg.partition("=")
            if name not in spec:
                raise _Fallthrough
            conv = spec[name]
            if conv is None:
                if eq:
                    raise _Fallthrough
                opts[name] = True
            else:
                if eq:
                    raw = inline
                elif i + 1 < len(args):
                    i += 1
                    raw = args[i]
                else:
                    raise _Fallthrough
                try:
                    value = conv(raw)
                except ValueError:
                    raise _Fallthrough from None
                if name == "--stop":
                    stops = opts.setdefault(name, [])
                    assert isinstance(stops, list)
                    stops.append(value)
                else:
                    opts[name] = value
        else:
            pos.append(arg)
        i += 1
    return pos, opts


def _model_ref(model: str | None) -> str | None:
    """cli._model_ref: ``default`` is the built-in model; paths become absolute."""
    if model in (None, "", "default"):
        return None
    if model.strip().startswith("/"):  # what normalize_ref does with it, without its imports
        return os.path.normpath(model.strip())
    from modeld.registry import normalize_ref

    return normalize_ref(model)


def _fail(reply: dict[str, object], started: bool) -> None:
    """An error reply: before any output the full CLI redoes and reports it; after, say it."""
    if not started:
        raise _Fallthrough
    from modeld.errors import error_from_dict

    exc = error_from_dict({k: v for k, v in reply.items() if k not in ("v", "id", "type")})
    hint = f"\n  hint: {exc.hint}" if exc.hint else ""
    sys.stderr.write(f"modeld: error: {exc.message}{hint}\n")
    sys.exit(int(exc.exit_code))


class _Status:
    """A status line on a terminal's stderr, shown only if the wait gets noticeable."""

    DELAY_S = 0.25

    def __init__(self, text: str) -> None:
        import time

        self.text, self.shown, self.done = text, False, False
        self.since = time.monotonic()
        self.enabled = sys.stderr.isatty() and not os.environ.get("MODELD_NO_SPINNER")

    def tick(self) -> None:
        import time

        waited = time.monotonic() - self.since
        if self.enabled and not self.shown and not self.done and waited >= self.DELAY_S:
            sys.stderr.write(f"{self.text}\r")
            sys.stderr.flush()
            self.shown = True

    def stop(self) -> None:
        if self.shown and not self.done:
            sys.stderr.write("\x1b[2K\r")
            sys.stderr.flush()
        self.done = True


def _wait_streaming(
    session: Session, rid: str, status: _Status, on_chunk: Callable[[str], None]
) -> dict[str, object]:
    """Replies of ``rid`` until done/error (as long as the daemon is there); chunks go to
    ``on_chunk``; the status line ticks while nothing arrives."""
    while True:
        reply = session.recv(rid, None, tick=status.tick)
        status.stop()
        if reply.get("type") != "chunk":
            return reply
        text = reply.get("text")
        if isinstance(text, str):
            on_chunk(text)


def _run(args: list[str]) -> None:
    """``modeld run MODEL PROMPT [options]``: runcmd.run_command's behaviour, fewer imports."""
    pos, o = _parse(args, _RUN_OPTS)
    if len(pos) != 2:
        raise _Fallthrough  # one argument may be a model or a prompt: the full CLI decides
    from modeld.runcmd import read_stdin_prompt

    model, prompt = _model_ref(pos[0]), pos[1]
    piped = read_stdin_prompt()
    if prompt and piped:
        prompt = f"{prompt}\n\n{piped}"
    elif piped:
        prompt = piped
    if not prompt:
        raise _Fallthrough
    options: dict[str, object] = {
        k: o[f"--{k.replace('_', '-')}"]
        for k in ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "keep_alive")
        if f"--{k.replace('_', '-')}" in o
    }
    system = o.get("--system")
    if "--raw" in o:
        options["raw"] = True
    if "--ctx" in o:
        options["n_ctx"] = o["--ctx"]
    session = Session()
    if "--raw" in o:
        text = f"{system}\n\n{prompt}" if system else prompt
        rid = session.send("generate", model=model, options=options, prompt=text)
    else:
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        rid = session.send("generate", model=model, options=options, messages=messages)
    out: list[str] = []

    def write(chunk: str) -> None:
        out.append(chunk)
        sys.stdout.write(chunk)
        sys.stdout.flush()

    try:
        reply = _wait_streaming(session, rid, _Status("waiting for the model…"), write)
    except (KeyboardInterrupt, BrokenPipeError):
        session.send("cancel", target=rid)  # free the model now, not when the daemon notices
        raise
    if reply.get("type") == "error":
        _fail(reply, bool(out))
    session.close()
    text = "".join(out)
    if sys.stdout.isatty() and not text.endswith("\n"):
        sys.stdout.write("\n")


def _load(args: list[str]) -> None:
    """``modeld load [MODEL] [--ctx N] [--keep-alive D] [--pin] [--embed] [--json]``."""
    import json
    import time

    pos, o = _parse(args, _LOAD_OPTS)
    if len(pos) > 1:
        raise _Fallthrough
    model = pos[0] if pos else None
    session = Session()
    rid = session.send(
        "load",
        model=_model_ref(model),
        mode="embed" if o.get("--embed") else "generate",
        n_ctx=o.get("--ctx"),
        keep_alive=o.get("--keep-alive"),
        pinned=bool(o.get("--pin")),
    )
    reply = _wait_streaming(
        session, rid, _Status(f"loading {model or 'the default model'}"), lambda _c: None
    )
    session.close()
    if reply.get("type") != "done":
        raise _Fallthrough
    row = reply["model"] if isinstance(reply.get("model"), dict) else {
        k: v for k, v in reply.items() if k not in ("v", "id", "type")
    }
    if o.get("--json"):  # render.emit_json's shape
        doc = {"schema_version": 1, "kind": "load", "model": row}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(ps_text([row], time.time()))  # type: ignore[list-item]
    sys.stdout.flush()


# ---------------------------------------------------------------------- help


def _columns() -> int:
    """shutil.get_terminal_size().columns without importing shutil."""
    try:
        cols = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        cols = 0
    if cols > 0:
        return cols
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


def render_help() -> str:
    """``modeld --help`` as the Typer app prints it at full width (for :mod:`modeld._help`).

    Rendered by the real CLI in a subprocess with ``COLUMNS=80``: click's help at 80 columns or
    more is identical, and its test runner truncates command summaries differently.
    """
    import subprocess

    env = dict(os.environ, COLUMNS=str(HELP_WIDTH), MODELD_NO_FAST="1")
    code = "from modeld.cli import main; main(['--help'])"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return proc.stdout


def write_help() -> str:
    """Regenerate src/modeld/_help.py from the Typer app; returns the file path."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_help.py")
    text = render_help()
    body = "".join(f"    {line!r}\n" for line in text.splitlines(keepends=True))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(
            '"""Pre-rendered ``modeld --help`` (regenerate: python -m modeld.entry --write-help).\n'
            '\ntests/test_entry.py fails when it no longer matches the Typer app.\n"""\n\n'
            f"HELP = (\n{body})\n"
        )
    return path


# ---------------------------------------------------------------------- main


def fast(argv: list[str]) -> bool:
    """Handle ``argv`` on the fast path; False when the full CLI must handle it."""
    if os.environ.get("MODELD_NO_FAST"):
        return False
    try:
        if argv == ["--version"]:
            from modeld import __version__

            sys.stdout.write(f"modeld {__version__}\n")
            return True
        if argv in (["--help"], ["-h"]) and _columns() >= HELP_WIDTH:
            from modeld._help import HELP

            sys.stdout.write(HELP)
            return True
        if argv in (["ps"], ["ps", "--json"]):
            _ps("--json" in argv)
            return True
        if argv[:1] == ["run"]:
            _run(argv[1:])
            return True
        if argv[:1] == ["load"]:
            _load(argv[1:])
            return True
    except _Fallthrough:
        return False
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return True
    except KeyboardInterrupt:
        sys.exit(130)  # ExitCode.INTERRUPTED, as the full CLI
    return False


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: the fast path, else the full Typer CLI."""
    args = sys.argv[1:] if argv is None else list(argv)
    if fast(args):
        return
    from modeld.cli import main as full_main

    full_main(argv)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-help"]:
        print(write_help())
    else:
        main()

"""The ``modeld`` console script: fast paths for run, load, ps, --help and --version.

Why: every shell call pays the CLI's start-up. The Typer app (cli/app.py) costs 60-200 ms of imports
before it does anything (Typer/click ~50 ms, modeld.config ~30 ms, pyzmq's Python layer 25-40
ms; ``python -X importtime``), several times a bare ``python -c pass`` and, for ``modeld run``
on a warm model, more than the generation itself. This module serves the hot commands with the
standard library only and falls through to :func:`modeld.cli.app.main` for everything else and for
any case it is not sure about (an option it does not know, one positional argument to ``run``,
a config file that sets the socket, no daemon, an error before any output), so usage and
errors are always reported by the one real CLI. docs/benchmarks.md has the measurements.

The daemon is reached over ZeroMQ through libzmq itself via ctypes (the libzmq that pyzmq
ships, or the system one), which skips pyzmq's Python import; if libzmq cannot be loaded the
same exchange runs on pyzmq (:mod:`modeld.cli.fastwire`). The wire messages are protocol v1
(docs/protocol.md), built as client.py builds them.

The ``--help`` text is pre-rendered from the Typer app into :mod:`modeld.cli._help` (a test keeps
it fresh; regenerate with ``python -m modeld.cli.entry --write-help``) and used only when click
would render it at its full width of 80 columns.
"""

from __future__ import annotations

import os
import sys

from modeld.cli.fastwire import FastSession, _Fallthrough, request

TYPE_CHECKING = False  # typing's import costs ~2 ms; mypy treats this name as typing's
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from modeld.wire.replyflow import ReplyStream

__all__ = ["fast", "main"]

HELP_WIDTH = 80  # click renders help at min(terminal columns, 80)

# ---------------------------------------------------------------------- ps


def ps_text(models: list[dict[str, object]], now: float) -> str:
    """The ``ps`` table: modeld.cli.pstable, the one implementation (stdlib only, no rich)."""
    from modeld.cli import pstable

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
    "--rerank": None,
    "--parallel": int,
    "--kv-unified": None,
    "--kv-separate": None,
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
    """cli._model_ref: ``default`` is the built-in model; paths become absolute. A hub name
    (``hf.co/…``, ``ORG/REPO:QUANT``) goes to the full CLI, which pulls it if it is missing."""
    if model in (None, "", "default"):
        return None
    if model.strip().lower().startswith(("hf.co/", "huggingface.co/", "https://")) or (
        ":" in model and "/" in model
    ):
        raise _Fallthrough
    if model.strip().startswith("/"):  # what normalize_ref does with it, without its imports
        return os.path.normpath(model.strip())
    from modeld.registry import normalize_ref

    return normalize_ref(model)


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
    session: FastSession, replies: ReplyStream, status: _Status, on_chunk: Callable[[str], None]
) -> dict[str, object]:
    """The done body of ``replies``' request, however long the daemon takes (an error reply
    raises); chunks go to ``on_chunk``; the status line ticks while nothing arrives."""
    while True:
        try:
            kind, body = session.recv(replies, None, tick=status.tick)
        finally:
            status.stop()
        if kind == "done":
            return body
        text = body.get("text")
        if isinstance(text, str):
            on_chunk(text)


def _run(args: list[str]) -> None:
    """``modeld run MODEL PROMPT [options]``: runcmd.run_command's behaviour, fewer imports."""
    pos, o = _parse(args, _RUN_OPTS)
    if len(pos) != 2:
        raise _Fallthrough  # one argument may be a model or a prompt: the full CLI decides
    from modeld.cli.stdin import read_stdin_prompt
    from modeld.wire.textcheck import from_argv

    model = _model_ref(pos[0])
    # no daemon: hand over now, before stdin is read (the full CLI reads it)
    session = FastSession()
    try:
        prompt, piped = from_argv(pos[1], "the prompt argument"), read_stdin_prompt()
    except BaseException:
        session.close()
        raise
    if prompt and piped:
        prompt = f"{prompt}\n\n{piped}"
    elif piped:
        prompt = piped
    if not prompt:
        session.close()
        raise _Fallthrough  # nothing read, nothing sent: the full CLI says what is missing
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
    if "--raw" in o:
        text = f"{system}\n\n{prompt}" if system else prompt
        replies = session.send("generate", model=model, options=options, prompt=text)
    else:
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        replies = session.send("generate", model=model, options=options, messages=messages)
    # Sent: from here on every failure is reported here, never handed to the full CLI (it would
    # send the request again, with stdin already consumed and part of the reply printed).
    out: list[str] = []

    def write(chunk: str) -> None:
        out.append(chunk)
        sys.stdout.write(chunk)
        sys.stdout.flush()

    try:
        _wait_streaming(session, replies, _Status("waiting for the model…"), write)
    except (KeyboardInterrupt, BrokenPipeError):
        try:  # noqa: SIM105 - contextlib costs start-up on the fast path
            # free the model now, not when the daemon notices
            session.send("cancel", target=replies.request_id)
        except _Fallthrough:
            pass  # the daemon notices the vanished client itself
        raise
    finally:
        session.close()
        if out and sys.stdout.isatty() and not out[-1].endswith("\n"):
            sys.stdout.write("\n")


def _load(args: list[str]) -> None:
    """``modeld load [MODEL] [--ctx N] [--keep-alive D] [--pin] [--embed|--rerank]
    [--parallel N] [--kv-unified|--kv-separate] [--json]``."""
    import json
    import time

    pos, o = _parse(args, _LOAD_OPTS)
    if len(pos) > 1:
        raise _Fallthrough
    model = pos[0] if pos else None
    ref = _model_ref(model)  # before the session: a hub name falls through here
    session = FastSession()
    replies = session.send(
        "load",
        model=ref,
        mode="embed" if o.get("--embed") else "rerank" if o.get("--rerank") else None,
        n_ctx=o.get("--ctx"),
        keep_alive=o.get("--keep-alive"),
        pinned=bool(o.get("--pin")),
        parallel=o.get("--parallel"),
        kv_unified=True if o.get("--kv-unified") else False if o.get("--kv-separate") else None,
    )
    try:  # sent: an error is reported here (by fast()), never sent again
        body = _wait_streaming(
            session, replies, _Status(f"loading {model or 'the default model'}"), lambda _c: None
        )
    finally:
        session.close()
    row = body["model"] if isinstance(body.get("model"), dict) else body
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
    """``modeld --help`` as the Typer app prints it at full width (for :mod:`modeld.cli._help`).

    Rendered by the real CLI in a subprocess with ``COLUMNS=80``: click's help at 80 columns or
    more is identical, and its test runner truncates command summaries differently.
    """
    import subprocess

    env = dict(os.environ, COLUMNS=str(HELP_WIDTH), MODELD_NO_FAST="1")
    code = "from modeld.cli.app import main; main(['--help'])"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return proc.stdout


def write_help() -> str:
    """Regenerate src/modeld/cli/_help.py from the Typer app; returns the file path."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_help.py")
    text = render_help()
    body = "".join(f"    {line!r}\n" for line in text.splitlines(keepends=True))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(
            '"""Pre-rendered ``modeld --help``'
            ' (regenerate: python -m modeld.cli.entry --write-help).\n'
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
            from modeld.cli._help import HELP

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
    except Exception as exc:
        from modeld.errors import ModeldError

        if not isinstance(exc, ModeldError):
            raise
        from modeld.cli import render  # the one error formatter, shared with the full CLI

        sys.exit(render.report_error(exc, json_out="--json" in argv))
    return False


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: the fast path, else the full Typer CLI."""
    args = sys.argv[1:] if argv is None else list(argv)
    if fast(args):
        return
    from modeld.cli.app import main as full_main

    full_main(argv)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-help"]:
        print(write_help())
    else:
        main()

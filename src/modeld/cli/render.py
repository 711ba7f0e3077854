"""One place that prints command results: versioned JSON for scripts, rich text for people.

Commands build plain data (dicts); this module decides how it looks. rich is imported only when
text is actually rendered, so ``--json`` and quiet paths stay cheap. Data goes to stdout,
messages to stderr; colour only on a terminal, and never when ``NO_COLOR`` is set.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from modeld.errors import ModeldError

JSON_SCHEMA_VERSION = 1


def to_json(kind: str, data: dict[str, Any]) -> str:
    """The documented JSON shape: ``{"schema_version": 1, "kind": ..., **data}``."""
    return json.dumps({"schema_version": JSON_SCHEMA_VERSION, "kind": kind, **data}, indent=2)


def emit_json(kind: str, data: dict[str, Any], stream: IO[str] | None = None) -> None:
    out = stream or sys.stdout
    out.write(to_json(kind, data) + "\n")
    out.flush()


def report_error(exc: ModeldError, *, json_out: bool) -> int:
    """Print an error the one way both CLI paths (Typer and the fast path) do; its exit code.

    With ``--json`` an ``error`` document goes to stdout too, so a script reading stdout always
    gets one JSON document. The message and hint always go to stderr.
    """
    if json_out:
        emit_json("error", {"error": exc.to_dict()})
    hint = f"\n  hint: {exc.hint}" if exc.hint else ""
    message(f"modeld: error: {exc.message}{hint}")
    return int(exc.exit_code)


def console(stderr: bool = False) -> Console:
    """A rich Console that respects NO_COLOR and only colours terminals."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    no_color = bool(os.environ.get("NO_COLOR"))
    return Console(file=stream, no_color=no_color, highlight=False, soft_wrap=False)


def key_value_table(title: str, rows: Iterable[tuple[str, str]]) -> Any:
    """A two-column table for ``show``-style output."""
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left", box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(_cell(key), _cell(value))
    return table


def grid_table(headers: Sequence[str], rows: Iterable[Sequence[str]], title: str = "") -> Any:
    """A plain column table for ``ps``/``list``-style output."""
    from rich import box
    from rich.table import Table

    table = Table(title=title or None, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for header in headers:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(c) for c in row))
    return table


def _cell(value: str) -> Any:
    """A table cell as text, not rich markup (a file named ``[red]x.gguf`` is printed as it
    is called), its unprintable characters escaped (:mod:`modeld.cli.visible`)."""
    from rich.text import Text

    from modeld.cli.visible import visible

    return Text(visible(value))


def print_renderables(*renderables: Any) -> None:
    """Print rich renderables; plain strings are written as they are (no markup, no wrapping)."""
    out: Console | None = None
    for item in renderables:
        if isinstance(item, str):
            sys.stdout.write(item if item.endswith("\n") else item + "\n")
            sys.stdout.flush()
            continue
        out = out or console()
        out.print(item)


def emit(
    kind: str,
    data: dict[str, Any],
    *,
    as_json: bool,
    text: Callable[[dict[str, Any]], Sequence[Any]],
) -> None:
    """Print ``data`` as versioned JSON or as the renderables ``text`` builds from it."""
    if as_json:
        emit_json(kind, data)
    else:
        print_renderables(*text(data))


def message(text: str) -> None:
    """A human message on stderr (status, hints); never mixed into data on stdout."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def thinking(text: str) -> None:
    """A piece of the model's thinking, dimmed, on stderr (stdout carries only the reply)."""
    sys.stderr.write(f"\x1b[2m{text}\x1b[0m")
    sys.stderr.flush()


def fmt_bytes(n: float | int | None) -> str:
    if n is None:
        return "-"
    from modeld.errors import format_bytes

    return format_bytes(n)


class status:
    """A spinner on stderr while something slow runs (only on a terminal)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._live: Any = None

    def __enter__(self) -> status:
        if sys.stderr.isatty() and not os.environ.get("MODELD_NO_SPINNER"):
            self._live = console(stderr=True).status(self.text)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Remove the spinner now (e.g. when the first token arrives)."""
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

"""Generate the man page and the shell completions from the Typer command tree.

Run ``python -m modeld.docgen`` (or ``scripts/gen-docs.sh``) after changing the CLI; a test
regenerates everything in memory and fails when the committed files are stale.

Completions are **static** scripts produced by walking the command tree, not Typer's own
``--show-completion`` scripts: those re-run ``modeld`` (Python start-up plus imports) on every
Tab press, while a static script answers from shell code alone, and it can still complete
model names (``*.gguf`` stems in the models directory) and ``.gguf`` files. The price is that the
scripts must be regenerated when the CLI changes, which the staleness test enforces.

Output is deterministic (no dates, no machine paths) so the files can be committed.
"""

from __future__ import annotations

import enum
import importlib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
import typer.main

MODEL = "model"  # hint: a model reference (name from the models dir, alias, or .gguf file)
PATH = "path"  # hint: any file

# Parameters that take a model reference, by parameter name.
MODEL_PARAMS = frozenset({"model", "models", "preload"})

# Values offered for options that take one of a few words (suggestions, not a closed set).
KEEP_ALIVE_SUGGESTIONS = ("5m", "30m", "1h", "0", "-1")

# Where each output goes, relative to the repository root.
OUTPUTS = {
    "bash": "completions/modeld.bash",
    "zsh": "completions/_modeld",
    "fish": "completions/modeld.fish",
    "man": "man/modeld.1",
}


@dataclass(frozen=True)
class Param:
    """One option or positional argument, reduced to what docs and completions need."""

    name: str  # Python parameter name
    names: tuple[str, ...]  # option spellings ("-v", "--verbose"); empty for arguments
    help: str
    takes_value: bool  # options only: False for flags
    metavar: str  # e.g. INTEGER, MODEL
    multiple: bool  # repeatable option, or variadic argument
    required: bool
    hint: str = ""  # MODEL, PATH, or "" (no completion)
    choices: tuple[str, ...] = ()  # suggested values
    closed: bool = False  # True when ``choices`` are the only valid values (an Enum)

    @property
    def is_option(self) -> bool:
        return bool(self.names)


@dataclass(frozen=True)
class Command:
    """A subcommand (or the root, with name ``""``)."""

    name: str
    help: str
    options: tuple[Param, ...]
    arguments: tuple[Param, ...]

    @property
    def summary(self) -> str:
        """First sentence-ish line of the help, for menus."""
        return self.help.split("\n\n")[0].replace("\n", " ").strip()

    def value_options(self) -> list[str]:
        return [n for p in self.options if p.takes_value for n in p.names]

    def all_option_names(self) -> list[str]:
        return [n for p in self.options for n in p.names]


# ---------------------------------------------------------------------- command tree


def _annotation(param: Any) -> Any:
    """The Python type behind a Typer parameter (``X | None`` and ``list[X]`` unwrapped to X)."""
    ann = getattr(getattr(param, "type_descriptor", None), "annotation", str)
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        ann = args[0] if args else str
    if typing.get_origin(ann) in (list, tuple, set):
        args = [a for a in typing.get_args(ann) if a is not Ellipsis]
        ann = args[0] if args else str
    return ann


def _type_metavar(ann: Any) -> str:
    if isinstance(ann, type) and issubclass(ann, bool):
        return "BOOLEAN"
    if isinstance(ann, type) and issubclass(ann, int):
        return "INTEGER"
    if isinstance(ann, type) and issubclass(ann, float):
        return "FLOAT"
    if isinstance(ann, type) and issubclass(ann, Path):
        return "PATH"
    return "TEXT"


def _param(param: Any, help_text: str | None) -> Param:
    """Reduce a Typer parameter to a :class:`Param`."""
    from modeld.settingvalues import LOG_LEVELS

    name = str(param.name)
    # Long names first, then short ones (a stable sort keeps the declared order within each):
    # click builds the help option's names from a set, so its raw order varies between runs.
    declared = list(param.opts) + list(param.secondary_opts) if _is_option(param) else []
    names = tuple(sorted(declared, key=lambda o: not str(o).startswith("--")))
    takes_value = bool(names) and not bool(getattr(param, "is_flag", False))
    ann = _annotation(param)
    hint, closed = "", False
    choices: tuple[str, ...] = ()
    if name in MODEL_PARAMS:
        hint = MODEL
    elif isinstance(ann, type) and issubclass(ann, Path):
        hint = PATH
    elif isinstance(ann, type) and issubclass(ann, enum.Enum):
        choices, closed = tuple(str(m.value) for m in ann), True
    elif name == "log_level":
        choices = tuple(LOG_LEVELS)
    elif name == "keep_alive":
        choices = KEEP_ALIVE_SUGGESTIONS
    if param.metavar:
        metavar = str(param.metavar)
    elif hint == MODEL:
        metavar = "MODEL"
    elif not names:
        metavar = name.upper()
    else:
        metavar = _type_metavar(ann)
    return Param(
        name=name,
        names=names,
        help=" ".join((help_text or "").split()),
        takes_value=takes_value,
        metavar=metavar,
        multiple=bool(param.multiple) or param.nargs == -1,
        required=bool(param.required),
        hint=hint,
        choices=choices,
        closed=closed,
    )


def _is_option(param: Any) -> bool:
    return any(str(o).startswith("-") for o in param.opts)


def _command(cmd: Any, ctx: Any, name: str) -> Command:
    options: list[Param] = []
    arguments: list[Param] = []
    for p in cmd.get_params(ctx):
        if getattr(p, "hidden", False):
            continue
        help_text = getattr(p, "help", None)
        if help_text is None:
            record = p.get_help_record(ctx)
            help_text = record[1] if record else ""
        item = _param(p, help_text)
        (options if item.is_option else arguments).append(item)
    return Command(name, (cmd.help or "").strip(), tuple(options), tuple(arguments))


def command_tree(app: typer.Typer | None = None) -> tuple[Command, list[Command]]:
    """The root command and the visible subcommands, in definition order."""
    try:  # typer >= 0.29 vendors click as typer._click; older ones use click itself
        Context = importlib.import_module("typer._click.core").Context
    except ImportError:  # pragma: no cover - depends on the typer version
        Context = importlib.import_module("click").Context

    if app is None:
        from modeld.cli.app import app as cli_app

        app = cli_app
    root = typer.main.get_command(app)
    root_ctx = Context(root, info_name="modeld", **root.context_settings)
    commands = getattr(root, "commands", {})
    subs = []
    for name, sub in commands.items():
        if getattr(sub, "hidden", False):
            continue
        ctx = Context(sub, parent=root_ctx, info_name=name, **sub.context_settings)
        subs.append(_command(sub, ctx, name))
    return _command(root, root_ctx, ""), subs

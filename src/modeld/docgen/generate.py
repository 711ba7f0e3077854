"""Writing (or checking) the generated files: man page and shell completions.

Apart from :mod:`modeld.docgen.build` (the command tree read from the Typer app) so the renderers
(:mod:`~modeld.docgen.man`, :mod:`~modeld.docgen.shells`) import the tree and this module imports
them: no circle.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from modeld import __version__
from modeld.docgen.build import OUTPUTS, command_tree
from modeld.docgen.man import render_man
from modeld.docgen.shells import render_bash, render_fish, render_zsh


def generate(app: typer.Typer | None = None) -> dict[str, str]:
    """Every generated file: relative path -> content."""
    root, subs = command_tree(app)
    return {
        OUTPUTS["bash"]: render_bash(root, subs),
        OUTPUTS["zsh"]: render_zsh(root, subs),
        OUTPUTS["fish"]: render_fish(root, subs),
        OUTPUTS["man"]: render_man(root, subs, __version__),
    }


def stale_files(root_dir: Path, app: typer.Typer | None = None) -> list[str]:
    """Generated files under ``root_dir`` that are missing or differ from a fresh generation."""
    stale = []
    for rel, content in generate(app).items():
        path = root_dir / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != content:
            stale.append(rel)
    return stale


def main(argv: list[str] | None = None) -> int:
    """``python -m modeld.docgen [--check] [ROOT]``: write (or check) the generated files."""
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    rest = [a for a in args if a != "--check"]
    root_dir = Path(rest[0]) if rest else Path.cwd()
    if check:
        stale = stale_files(root_dir)
        for rel in stale:
            print(f"stale: {rel} (run scripts/gen-docs.sh)", file=sys.stderr)
        return 1 if stale else 0
    for rel, content in generate().items():
        path = root_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        print(f"wrote {rel}")
    return 0

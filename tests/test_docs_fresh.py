"""The man page and shell completions are generated from the CLI and must stay in step with it.

Regenerating in memory must equal the committed files; the scripts must parse and complete in
real shells (zsh and fish only where installed); the roff is checked structurally so the test
means something without ``man``, and rendered by ``man`` where it exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from modeld.config import ENV_VARS
from modeld.docgen import build as docgen
from modeld.docgen import generate as docgen_generate
from modeld.docgen import man as docgen_man
from modeld.errors import ExitCode

ROOT = Path(__file__).resolve().parent.parent
BASH = ROOT / "completions" / "modeld.bash"
ZSH = ROOT / "completions" / "_modeld"
FISH = ROOT / "completions" / "modeld.fish"
MAN = ROOT / "man" / "modeld.1"


@pytest.fixture(scope="module")
def tree() -> tuple[docgen.Command, list[docgen.Command]]:
    return docgen.command_tree()


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return docgen_generate.generate()


def test_committed_files_match_a_fresh_generation(generated: dict[str, str]) -> None:
    stale = [
        rel
        for rel, content in generated.items()
        if not (ROOT / rel).is_file() or (ROOT / rel).read_text(encoding="utf-8") != content
    ]
    assert not stale, f"stale generated files {stale}: run scripts/gen-docs.sh and commit them"


def test_generation_is_deterministic(generated: dict[str, str]) -> None:
    assert docgen_generate.generate() == generated


def test_check_mode_reports_a_stale_file(tmp_path: Path, generated: dict[str, str]) -> None:
    for rel, content in generated.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content, encoding="utf-8")
    assert docgen_generate.main(["--check", str(tmp_path)]) == 0
    (tmp_path / docgen.OUTPUTS["man"]).write_text(".TH OLD 1\n", encoding="utf-8")
    assert docgen_generate.main(["--check", str(tmp_path)]) == 1


# ---------------------------------------------------------------------- man page (structure)


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^\.SH (.+)$", text, flags=re.MULTILINE)
    return {parts[i].strip('"'): parts[i + 1] for i in range(1, len(parts), 2)}


def test_man_page_has_the_standard_sections_in_order() -> None:
    names = list(_sections(MAN.read_text(encoding="utf-8")))
    assert names == [
        "NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "COMMANDS",
        "ENVIRONMENT", "FILES", "EXIT STATUS", "EXAMPLES", "SEE ALSO",
    ]  # fmt: skip


def test_every_command_and_option_is_documented_under_commands(
    tree: tuple[docgen.Command, list[docgen.Command]],
) -> None:
    root, subs = tree
    commands = _sections(MAN.read_text(encoding="utf-8"))["COMMANDS"]
    found = re.findall(r"^\.SS (\S+)\n(.*?)(?=^\.SS |\Z)", commands, re.M | re.S)
    blocks = {name.replace("\\-", "-"): text for name, text in found}  # roff escapes "-"
    assert list(blocks) == [c.name for c in subs]
    assert {"serve", "run", "ps", "show", "list"} <= set(blocks)
    for cmd in subs:
        for name in cmd.all_option_names():
            assert f"\\fB{docgen_man.esc(name)}\\fR" in blocks[cmd.name], (cmd.name, name)
        for arg in cmd.arguments:
            assert f"\\fI{arg.metavar}\\fR" in blocks[cmd.name], (cmd.name, arg.name)
        assert docgen_man.esc(cmd.summary) in blocks[cmd.name]
    options = _sections(MAN.read_text(encoding="utf-8"))["OPTIONS"]
    assert "\\fB\\-\\-version\\fR" in options
    assert len(root.options) == options.count(".TP")


def test_environment_and_exit_status_come_from_the_code() -> None:
    sections = _sections(MAN.read_text(encoding="utf-8"))
    env = sections["ENVIRONMENT"]
    for var in [*ENV_VARS.values(), "MODELD_CONFIG", "MODELD_NO_AUTOSTART", "NO_COLOR"]:
        assert f".B {docgen_man.esc(var)}\n" in env, var

    exits = sections["EXIT STATUS"]
    for code in ExitCode:
        assert f".B {int(code)}\n{docgen_man.esc(code.name)}: " in exits, code
    assert set(docgen_man.EXIT_MEANINGS) == set(ExitCode.__members__)


def test_man_page_is_clean_roff() -> None:
    text = MAN.read_text(encoding="utf-8")
    assert text.isascii(), "non-ASCII characters must be escaped as \\[uXXXX]"
    macros = {"TH", "SH", "SS", "TP", "PP", "B", "I", "RI", "BR", "br", "RS", "RE", "nf", "fi"}
    for n, line in enumerate(text.splitlines(), 1):
        assert line.strip(), f"blank line {n} (use .PP)"
        assert not line.startswith(" "), f"line {n} starts with a space"
        if line.startswith(".") and not line.startswith('.\\"'):
            assert line[1:].split()[0] in macros, f"line {n}: unknown macro {line!r}"
        assert not line.startswith("'"), f"line {n} would be read as a control line"
        if not line.startswith('.\\"'):  # hyphens are written \- (a plain - may become a dash)
            assert not re.search(r"(?<!\\)-", line), f"line {n}: unescaped hyphen"


def test_man_examples_use_real_commands_and_options(
    tree: tuple[docgen.Command, list[docgen.Command]],
) -> None:
    _, subs = tree
    docgen_man._check_examples(subs)  # raises on an unknown command or option
    with pytest.raises(ValueError, match="unknown option"):
        broken = [docgen.Command(c.name, c.help, (), c.arguments) for c in subs]
        docgen_man._check_examples(broken)


@pytest.mark.skipif(sys.platform != "linux", reason="XDG layout is the Linux default")
def test_documented_file_locations_match_modeld_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modeld import paths

    xdg = {}
    for var in ("XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "XDG_STATE_HOME", "XDG_DATA_HOME",
                "XDG_CACHE_HOME"):
        xdg[var] = tmp_path / var.lower()
        xdg[var].mkdir()
        monkeypatch.setenv(var, str(xdg[var]))
    for var in ("MODELD_RUNTIME_DIR", "MODELD_SOCKET", "MODELD_CONFIG", "MODELD_LOG_DIR",
                "MODELD_MODELS", "MODELD_PROMPT_CACHE_DIR"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    actual = {
        "config_file": paths.config_file(),
        "socket": paths.ipc_path(paths.socket_endpoint()),
        "lock_file": paths.lock_file(),
        "log_dir": paths.log_dir(),
        "models_dir": paths.models_dir(),
        "prompt_cache_dir": paths.prompt_cache_dir(),
    }
    assert set(actual) == set(docgen_man.FILE_TEMPLATES)
    for key, template in docgen_man.FILE_TEMPLATES.items():
        expected = template
        for var, value in xdg.items():
            expected = expected.replace(f"${var}", str(value))
        assert str(actual[key]) == expected, key


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_man_renders_without_warnings() -> None:
    env = {**os.environ, "LC_ALL": "C.UTF-8", "MANWIDTH": "80", "MAN_DISABLE_SECCOMP": "1"}
    lint = subprocess.run(
        ["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", str(MAN)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stderr
    assert lint.stderr == "", lint.stderr
    shown = subprocess.run(
        ["man", "-l", str(MAN)], capture_output=True, text=True, env=env, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert "modeld - keep local GGUF models" in " ".join(shown.stdout.split())
    assert "MODELD_KEEP_ALIVE" in shown.stdout


# ---------------------------------------------------------------------- packaging


def test_wheel_installs_the_man_page_and_completions() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    data_files = config["tool"]["setuptools"]["data-files"]
    assert data_files == {
        "share/man/man1": [docgen.OUTPUTS["man"]],
        "share/bash-completion/completions": [docgen.OUTPUTS["bash"]],
        "share/zsh/site-functions": [docgen.OUTPUTS["zsh"]],
        "share/fish/vendor_completions.d": [docgen.OUTPUTS["fish"]],
    }
    # Each shell looks a completion up by the command's name.
    assert [Path(docgen.OUTPUTS[s]).name for s in ("bash", "zsh", "fish")] == [
        "modeld.bash", "_modeld", "modeld.fish",
    ]  # fmt: skip


# ---------------------------------------------------------------------- bash


def _bash_complete(
    words: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> list[str]:
    """Run the completion function for ``words`` (the last one is being completed)."""
    script = (
        f"source {BASH}\n"
        'COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMPREPLY=()\n'
        "_modeld\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    result = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script, "bash", *words],
        capture_output=True, text=True, timeout=30, env={**os.environ, **(env or {})}, cwd=cwd,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line]


def test_bash_script_parses() -> None:
    result = subprocess.run(["bash", "-n", str(BASH)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_bash_completes_commands_options_and_values() -> None:
    assert _bash_complete(["modeld", "sh"]) == ["show"]
    assert "serve" in _bash_complete(["modeld", ""])
    assert _bash_complete(["modeld", "show", "--c"]) == ["--ctx"]
    assert _bash_complete(["modeld", "serve", "--log-level", "d"]) == ["debug"]
    # "--keep-alive=" as bash splits it (COMP_WORDBREAKS contains "=")
    assert "5m" in _bash_complete(["modeld", "run", "--keep-alive", "=", ""])
    assert _bash_complete(["modeld", "nosuchcommand", "--"]) == []


@pytest.fixture()
def models_dir(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    (d / "org").mkdir(parents=True)
    for name in ("tiny.gguf", "org/big-00001-of-00002.gguf", "org/big-00002-of-00002.gguf"):
        (d / name).write_bytes(b"GGUF")
    (d / "notes.txt").write_text("not a model")
    return d


def test_bash_completes_model_names_and_gguf_files(models_dir: Path, tmp_path: Path) -> None:
    env = {"MODELD_MODELS": str(models_dir)}
    empty = tmp_path / "empty"
    empty.mkdir()
    names = _bash_complete(["modeld", "show", ""], env, cwd=empty)
    assert sorted(names) == ["big", "default", "tiny"]
    # directories of the working directory are offered too (models may sit in subdirectories)
    assert "models" in _bash_complete(["modeld", "show", ""], env, cwd=tmp_path)
    # only the model argument, not the prompt after it; option values are skipped when counting
    assert _bash_complete(["modeld", "run", "tiny", ""], env, cwd=empty) == []
    assert _bash_complete(["modeld", "run", "--seed", "3", "ti"], env, cwd=empty) == ["tiny"]
    assert _bash_complete(["modeld", "serve", "--preload", "b"], env, cwd=empty) == ["big"]
    # .gguf files by path (other files are not offered)
    files = _bash_complete(["modeld", "load", f"{models_dir}/"], env, cwd=empty)
    assert f"{models_dir}/tiny.gguf" in files
    assert f"{models_dir}/org" in files
    assert not any(f.endswith("notes.txt") for f in files)


# ---------------------------------------------------------------------- zsh and fish


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_parses_and_registers() -> None:
    parsed = subprocess.run(["zsh", "-n", str(ZSH)], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr
    script = (
        f"fpath=({ZSH.parent} $fpath); autoload -Uz compinit; compinit -u -D\n"
        'print -r -- "$_comps[modeld]"\n'
    )
    result = subprocess.run(["zsh", "-f", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "_modeld"


# Drives an interactive zsh on a pseudo-terminal: types each line, asks for the list of
# completions (Ctrl-D) and waits until the screen shows the expected pattern. A missing
# completion shows up as the subprocess timeout.
_ZPTY = r"""
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "PS1='> '; fpath=($1 \$fpath); autoload -U compinit; compinit -u -D; cd $2; print RE''ADY"
expect() {
  local out="" chunk
  until [[ $out == *$~1* ]]; do
    if zpty -r -t z chunk; then out+=$chunk; else sleep 0.05; fi
  done
}
expect READY
shift 2
while (( $# >= 2 )); do
  zpty -w -n z "$1"$'\C-d'
  expect "$2" && print -r -- "ok: $1"
  zpty -w -n z $'\C-u'
  shift 2
done
zpty -d z
"""


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completes_interactively(models_dir: Path, tmp_path: Path) -> None:
    cases = {  # in an order where no pattern can match an earlier case's output
        "modeld show b": "big",
        "modeld run --seed 3 t": "tiny",  # the option's value is not the model argument
        "modeld sh": "show*Model metadata",
        "modeld show ": "big*default*tiny",
        "modeld serve --log-level ": "debug*error*info*warning",
        "modeld run --c": "--ctx*Context length",
    }
    args = [str(ZSH.parent), str(models_dir.parent)]
    for line, pattern in cases.items():
        args += [line, pattern]
    try:
        result = subprocess.run(
            ["zsh", "-f", "-c", _ZPTY, "zsh", *args],
            capture_output=True, text=True, timeout=30,
            env={**os.environ, "MODELD_MODELS": str(models_dir)},
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"zsh did not offer an expected completion; got so far: {exc.stdout!r}")
    assert result.stdout.splitlines() == [f"ok: {line}" for line in cases], result.stderr


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_script_parses_and_completes(models_dir: Path) -> None:
    parsed = subprocess.run(["fish", "--no-execute", str(FISH)], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr

    def complete(line: str) -> list[str]:
        result = subprocess.run(
            ["fish", "--no-config", "-c", f"source {FISH}; complete -C {line!r}"],
            capture_output=True, text=True, timeout=30,
            env={**os.environ, "MODELD_MODELS": str(models_dir)},
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return [row.split("\t")[0] for row in result.stdout.splitlines()]

    assert complete("modeld sh") == ["show"]
    assert "--ctx" in complete("modeld show --")
    assert {"default", "tiny", "big"} <= set(complete("modeld show "))
    assert "tiny" not in complete("modeld run tiny ")
    assert complete("modeld serve --log-level d") == ["debug"]

#!/usr/bin/env bash
# Set up modeld in ./.venv on a fresh machine: a virtual environment, llama-cpp-python built
# with CPU flags that work here (DESIGN.md §11), modeld itself, and the built-in default model.
#   scripts/setup.sh          runtime + default model
#   scripts/setup.sh --test   also the test/lint tools
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${MODELD_VENV:-.venv}"
extras="default-model"
[ "${1:-}" = "--test" ] && extras="test,ray"  # ray: the cluster tests (tests/test_cluster.py)

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip wheel

# CPU flags that work here (see scripts/cpuflags.sh; the default native build crashes on this CPU class).
if [ -z "${CMAKE_ARGS:-}" ]; then
    CMAKE_ARGS="$(scripts/cpuflags.sh)"
    export CMAKE_ARGS
fi

if ! "$VENV/bin/python" -c "import llama_cpp" >/dev/null 2>&1; then
    echo "setup: building llama-cpp-python (about 8 minutes the first time; pip caches the wheel)" >&2
    "$VENV/bin/python" -m pip install --quiet "llama-cpp-python==0.3.36"
fi
"$VENV/bin/python" -m pip install --quiet -e ".[$extras]"
# An editable install copies no data files: put the man page and completions under the venv's
# share/ (man finds <dir>/../share/man for each <dir> on PATH, so `man modeld` works once
# .venv/bin is on PATH).
mkdir -p "$VENV/share/man/man1" "$VENV/share/bash-completion/completions" \
    "$VENV/share/zsh/site-functions" "$VENV/share/fish/vendor_completions.d"
cp man/modeld.1 "$VENV/share/man/man1/"
cp completions/modeld.bash "$VENV/share/bash-completion/completions/modeld"
cp completions/_modeld "$VENV/share/zsh/site-functions/"
cp completions/modeld.fish "$VENV/share/fish/vendor_completions.d/"
echo "setup: ready — $VENV/bin/modeld" >&2

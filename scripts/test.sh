#!/usr/bin/env bash
# Set up modeld with its test tools in ./.venv (see scripts/setup.sh), then lint, type-check
# and run the whole test suite. This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
VENV="${MODELD_VENV:-.venv}"
echo "== ruff" >&2
"$VENV/bin/ruff" check src tests bench
echo "== mypy --strict" >&2
"$VENV/bin/mypy"
echo "== pytest" >&2
"$VENV/bin/pytest" -q "$@"

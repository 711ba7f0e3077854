#!/usr/bin/env bash
# Regenerate the man page (man/modeld.1) and the shell completions (completions/) from the CLI.
# Run after changing src/modeld/cli.py; tests/test_docs_fresh.py fails while they are stale.
# "scripts/gen-docs.sh --check" only reports stale files (exit status 1).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MODELD_VENV:-.venv}"
exec "$VENV/bin/python" -m modeld.docgen "$@" .

#!/usr/bin/env bash
# The benchmark command: set up ./.venv like scripts/setup.sh (llama-cpp-python built with CPU
# flags that work here, modeld, the default model, test tools), add what the benchmarks need
# (llama-cpp-python's own server, for the trace comparison), then run every benchmark and write
# bench/results/*.json and docs/benchmarks.md. About 13 minutes on 2 cores (after setup).
#   scripts/bench.sh                 everything
#   scripts/bench.sh --rounds 3      quicker and noisier (any bench/run.py options pass through)
#   scripts/bench.sh --smoke --out /tmp/bench-smoke   tiny models, one round (what the test runs)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --test
VENV="${MODELD_VENV:-.venv}"
PY="$VENV/bin/python"

# The [server] extra only adds Python packages (fastapi, uvicorn, ...): the installed
# llama-cpp-python build is kept (same version), so nothing is recompiled.
if ! "$PY" -c "import llama_cpp.server.app" >/dev/null 2>&1; then
    echo "bench: installing llama-cpp-python[server] extras" >&2
    "$PY" -m pip install --quiet "llama-cpp-python[server]==0.3.36"
fi

smoke=0
for arg in "$@"; do [ "$arg" = "--smoke" ] && smoke=1; [ "${arg%%=*}" = "--only" ] && smoke=1; done
if [ "$smoke" = 0 ]; then
    echo "== memory estimate calibration (bench/calibrate.py)" >&2
    "$PY" bench/calibrate.py || echo "bench: calibration is outside its tolerance (see above)" >&2
    echo "== GGUF metadata read time (bench/gguf_read.py)" >&2
    "$PY" bench/gguf_read.py >/dev/null
fi
echo "== benchmarks (bench/run.py)" >&2
"$PY" bench/run.py "$@"
if [ "$smoke" = 0 ]; then  # the full suite only (not --smoke, not --only)
    echo "== reliability: chaos run, 10 minutes (bench/chaos.py)" >&2
    "$PY" bench/chaos.py
    "$PY" bench/report.py >/dev/null
fi

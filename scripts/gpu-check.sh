#!/usr/bin/env bash
# The card check of issues 34 and 44 in one command (docs/architecture.md, "Not yet working on
# a card"). With this project's device tool: `scripts/gpu-check.sh prepare` here, then one call
#   run(command='scripts/gpu-check.sh', carry=['.gpu'], timeout_s=600)   (it stops by 540 s)
#
#   scripts/gpu-check.sh prepare     here, with a package index: fills .gpu/ (ignored by git, ~35
#                                    MB): the pinned llama-cpp-python sdist slimmed, cp312 wheels
#                                    of what the card's machine lacks (it has no network)
#   OUT=/out scripts/gpu-check.sh    on the card's machine (nvcc, cmake, ninja, Python 3.12), from
#                                    a checkout that carries .gpu/: builds llama.cpp for the card
#                                    (~260 s on 16 cores), then bench/gpu_check.py: build facts,
#                                    relinks, the theory configurations, a real runner load per
#                                    candidate fix, pytest -m gpu and bench/gpu_bench.py with the
#                                    first that loads. $OUT gets <= 8 files: summary.md (printed
#                                    too), results.json, gpu.json, logs.tar.gz
#   OUT=/tmp/o scripts/gpu-check.sh --cpu
#                                    the same steps on this checkout's CPU build (.venv), no card,
#                                    a tiny generated model, short deadlines: tests/test_gpu_check.py
#
# Every step has its own deadline inside GPU_CHECK_BUDGET seconds (card: 540, --cpu: 240), so
# a slow step cannot eat the rest and the files are always written.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd); G=$ROOT/.gpu; V=0.3.36
T0=$(date +%s)
if [ "${1:-}" = prepare ]; then
    set -e
    rm -rf "$G"; mkdir -p "$G/whl"; T=$(mktemp -d)
    PIP="${PIP:-$ROOT/.venv/bin/pip}"
    "$PIP" download -q --no-deps --no-binary :all: "llama-cpp-python==$V" -d "$T"
    tar xzf "$T/llama_cpp_python-$V.tar.gz" -C "$T"
    S=$T/llama_cpp_python-$V; L=$S/vendor/llama.cpp
    rm -rf "$S/.git" "$S/examples" "$S/docker" "$L"/{models,docs,media,benches,gguf-py,conversion} \
           "$L"/tools/server/tests "$L"/examples/*/ "$L"/pocs/*/
    for b in virtgpu cann openvino webgpu et metal hexagon sycl vulkan opencl zdnn musa hip blas kompute zendnn; do
        rm -rf "$L/ggml/src/ggml-$b"; done
    tar czf "$G/llcpp-slim.tar.gz" -C "$T" "llama_cpp_python-$V"
    P="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
    "$PIP" download -q --only-binary=:all: --python-version 3.12 --implementation cp $P -d "$G/whl" \
        pyzmq platformdirs starlette uvicorn diskcache gguf typer click rich psutil nvidia-ml-py \
        numpy jinja2 markupsafe typing-extensions pydantic pytest sentencepiece pyyaml tqdm prometheus-client
    rm -rf "$T"; du -sh "$G"; exit 0
fi

W=$(mktemp -d); OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT" "$W/logs"
el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$W/logs/steps.log"; }
if [ "${1:-}" = --cpu ]; then
    BUDGET=${GPU_CHECK_BUDGET:-240}
    PY=${PY:-$ROOT/.venv/bin/python}
    LIB=$("$PY" -c "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / 'lib')")
    export PYTHONPATH=$ROOT/src:$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}
    MODEL=$("$PY" -c "import ggufgen, pathlib; print(ggufgen.cached_model(pathlib.Path('$ROOT/tests/.models'), 'llama', **ggufgen.TINY))")
    SERVER=$("$PY" -c "import sys; sys.path.insert(0, '$ROOT/bench'); import peer; b = peer.cache_dir(); \
print(next(iter(sorted(b.glob('*/llama.cpp/build/bin/llama-server'))), 'none'))" 2>/dev/null || echo none)
    el "cpu mode: $LIB, model $MODEL, llama-server $SERVER"
    "$PY" "$ROOT/bench/gpu_check.py" run --cpu --out "$OUT" --work "$W" --lib "$LIB" --model "$MODEL" \
        --big "$MODEL" --server "$SERVER" --deadline $(( T0 + BUDGET ))
    rc=$?; rm -rf "$W"; exit $rc
fi

BUDGET=${GPU_CHECK_BUDGET:-540}
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "gpu-check: no NVIDIA card visible (nvidia-smi lists none): run it on a machine with a card, or --cpu" >&2
    exit 3
fi
[ -f "$G/llcpp-slim.tar.gz" ] || { echo "gpu-check: no $G/llcpp-slim.tar.gz: run 'scripts/gpu-check.sh prepare' where a package index is reachable" >&2; exit 2; }
for tool in nvcc cmake ninja python3 nm readelf; do
    command -v $tool >/dev/null || { echo "gpu-check: $tool is missing" >&2; exit 2; }; done
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv | tee "$W/logs/card.csv"
PY=${PY:-python3}  # the wheels in .gpu/whl are for CPython 3.12
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' || {
    echo "gpu-check: $PY is $("$PY" -V 2>&1), .gpu/whl holds CPython 3.12 wheels: PY=python3.12" >&2; exit 2; }
$PY -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$G"/whl/*.whl 2>&1 | tail -2
tar xzf "$G/llcpp-slim.tar.gz" -C "$W"; L=$W/llama_cpp_python-$V; LL=$L/vendor/llama.cpp
export PYTHONPATH=$W/site:$L:$ROOT/src:$ROOT/tests
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
el "cmake (sm_$ARCH)"
timeout 60 cmake -S "$LL" -B "$LL/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGGML_NATIVE=ON -DGGML_RPC=ON -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_CUDA_NCCL=OFF > "$W/logs/cmake.log" 2>&1
( $PY -c "import ggufgen; ggufgen.make_llama_model('$W/big.gguf', n_layer=22, n_embd=2048, n_head=32, n_head_kv=4, n_ff=5632, n_vocab=32000, context_length=32768, dtype='f16')" > "$W/logs/gen.log" 2>&1 ) &
GEN=$!
el build; timeout 360 ninja -C "$LL/build" -j "$(nproc)" llama mtmd llama-server > "$W/logs/build.log" 2>&1
rc=$?; el "build rc=$rc"
if [ $rc != 0 ]; then
    tail -30 "$W/logs/build.log"; tar czf "$OUT/logs.tar.gz" -C "$W" logs; exit 4
fi
mkdir -p "$L/llama_cpp/lib" && find "$LL/build" -name "*.so*" -exec cp -P {} "$L/llama_cpp/lib/" \;
$PY -c "import llama_cpp; from modeld.daemon.forkserver import gpu_backends; print('backends', gpu_backends())" 2>&1 | tee -a "$W/logs/steps.log"
MODEL=$($PY -c "import ggufgen, pathlib; print(ggufgen.cached_model(pathlib.Path('$W/models'), 'llama', **ggufgen.TINY))")
timeout 120 tail --pid=$GEN -f /dev/null; el "model generated"
$PY "$ROOT/bench/gpu_check.py" run --out "$OUT" --work "$W" --lib "$L/llama_cpp/lib" --build "$LL/build" \
    --model "$MODEL" --big "$W/big.gguf" --server "$LL/build/bin/llama-server" --deadline $(( T0 + BUDGET ))
rc=$?; el "done rc=$rc"; exit $rc

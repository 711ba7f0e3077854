#!/usr/bin/env bash
# The card path of issue 34 in one go, on a machine with an NVIDIA card (nvcc, cmake, ninja,
# Python 3.12, no package index):
#   scripts/gpu-check.sh prepare        here, with a package index: fills .gpu/ (ignored by git):
#                                       the pinned llama-cpp-python sdist slimmed, cp312 wheels
#   OUT=/tmp/out scripts/gpu-check.sh   there, from a checkout that carries .gpu/: a CUDA build
#                                       (~250 s on 16 cores), the runner's pre-load bisect
#                                       (bench/gpu_bisect.py), pytest -m gpu, the GPU benchmark
#                                       (bench/gpu_bench.py); everything under $OUT
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd); G=$ROOT/.gpu; V=0.3.36
if [ "${1:-}" = prepare ]; then
    set -e
    mkdir -p "$G/whl"; T=$(mktemp -d)
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
        numpy jinja2 markupsafe typing-extensions pydantic pytest sentencepiece pyyaml tqdm
    rm -rf "$T"; du -sh "$G"; exit 0
fi
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/steps.log"; }
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "gpu-check: no NVIDIA card visible (nvidia-smi lists none): run it on a machine with a card" >&2
    exit 3
fi
[ -f "$G/llcpp-slim.tar.gz" ] || { echo "gpu-check: no $G/llcpp-slim.tar.gz: run 'scripts/gpu-check.sh prepare' where a package index is reachable" >&2; exit 2; }
for tool in nvcc cmake ninja python3; do
    command -v $tool >/dev/null || { echo "gpu-check: $tool is missing" >&2; exit 2; }; done
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv | tee "$OUT/card.csv"
W=$(mktemp -d); PY=python3
$PY -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$G"/whl/*.whl 2>&1 | tail -2
tar xzf "$G/llcpp-slim.tar.gz" -C "$W"; L=$W/llama_cpp_python-$V; LL=$L/vendor/llama.cpp
export PYTHONPATH=$W/site:$L:$ROOT/src:$ROOT/tests
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
el "cmake (sm_$ARCH)"
cmake -S "$LL" -B "$LL/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGGML_NATIVE=ON -DGGML_RPC=ON -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_CUDA_NCCL=OFF > "$OUT/cmake.log" 2>&1
( $PY -c "import ggufgen; ggufgen.make_llama_model('$W/big.gguf', n_layer=22, n_embd=2048, n_head=32, n_head_kv=4, n_ff=5632, n_vocab=32000, context_length=32768, dtype='f16')" > "$OUT/gen.log" 2>&1 ) &
GEN=$!
el build; ninja -C "$LL/build" -j "$(nproc)" llama mtmd llama-server > "$OUT/build.log" 2>&1
rc=$?; el "build rc=$rc"; [ $rc = 0 ] || { tail -30 "$OUT/build.log"; exit 4; }
mkdir -p "$L/llama_cpp/lib" && find "$LL/build" -name "*.so*" -exec cp -P {} "$L/llama_cpp/lib/" \;
$PY -c "import llama_cpp; from modeld.daemon.forkserver import gpu_backends; print('backends', gpu_backends())" | tee -a "$OUT/steps.log"
TINY=$($PY -c "import ggufgen, pathlib; print(ggufgen.cached_model(pathlib.Path('$W/models'), 'llama', **ggufgen.TINY))")
el bisect; timeout 300 $PY "$ROOT/bench/gpu_bisect.py" "$TINY" "$OUT/bisect.jsonl" -1 2>&1 | tee "$OUT/bisect.txt"
el "pytest -m gpu"; ( cd "$ROOT" && timeout 300 $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -s ) 2>&1 | tee "$OUT/pytest.txt" | tail -15
wait $GEN
el bench; ( cd "$OUT" && OUT=$OUT timeout 420 $PY "$ROOT/bench/gpu_bench.py" main "$W/big.gguf" "$LL/build/bin/llama-server" ) > "$OUT/bench.txt" 2>&1; tail -5 "$OUT/bench.txt"
el done

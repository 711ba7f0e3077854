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

# CPU flags that work here (see scripts/cpuflags.sh; the default native build crashes on this CPU class),
# plus llama.cpp's RPC backend (-DGGML_RPC=ON: `modeld rpc-worker` and per-model `rpc` workers;
# docs/rpc.md). A CMAKE_ARGS of your own is kept; it gets -DGGML_RPC=ON unless it names GGML_RPC.
# The backend: CUDA when this machine has a CUDA toolkit (nvcc) AND an NVIDIA driver with a card
# (nvidia-smi lists one), else CPU; MODELD_BACKEND=cpu|cuda decides instead. A toolkit without a
# card (a build container, CI) gets the CPU build: a CUDA build there could not be checked.
backend="${MODELD_BACKEND:-}"
nvcc_bin=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -z "$backend" ]; then
    backend=cpu
    if [ -n "$nvcc_bin" ] && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        backend=cuda
    fi
fi
case "$backend" in
    cpu|cuda) ;;
    *) echo "setup: MODELD_BACKEND must be cpu or cuda, not '$backend'" >&2; exit 2 ;;
esac
if [ -z "${CMAKE_ARGS:-}" ]; then
    CMAKE_ARGS="$(scripts/cpuflags.sh)"
    if [ "$backend" = cuda ]; then
        [ -n "$nvcc_bin" ] || { echo "setup: MODELD_BACKEND=cuda needs nvcc (a CUDA toolkit)" >&2; exit 2; }
        # the card's architecture ("90" for an H100); native when nvidia-smi cannot say
        arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
        CMAKE_ARGS="$CMAKE_ARGS -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${arch:-native} -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_COMPILER=$nvcc_bin"
        # MODELD_CUDA_LINK=exclude-libs|hide-std: link llama.cpp's libraries so that they export
        # no libstdc++ code of their own (scripts/cuda-link.sh; issue 44, default unchanged until
        # scripts/gpu-check.sh on a card says which is right)
        link_flags=$(scripts/cuda-link.sh "${MODELD_CUDA_LINK:-default}")
        [ -z "$link_flags" ] || CMAKE_ARGS="$CMAKE_ARGS -DCMAKE_SHARED_LINKER_FLAGS=$link_flags"
    fi
fi
echo "setup: llama.cpp backend: $backend (MODELD_BACKEND=cpu|cuda to choose)" >&2
if [[ "$CMAKE_ARGS" != *GGML_RPC* ]]; then
    CMAKE_ARGS="$CMAKE_ARGS -DGGML_RPC=ON"
fi
export CMAKE_ARGS
want_rpc=0
[[ " $CMAKE_ARGS " == *" -DGGML_RPC=ON "* ]] && want_rpc=1

# pip's own wheel cache is keyed by the sdist, not by CMAKE_ARGS (it would hand back a build
# with other flags), so the built wheel is kept in a folder named after the flags.
LLAMA_VERSION="0.3.36"
flags_key=$(printf '%s %s' "$LLAMA_VERSION" "$CMAKE_ARGS" | sha256sum | cut -c1-16)
WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/modeld/wheels/$flags_key"

need_build=0
if ! "$VENV/bin/python" -c "import llama_cpp" >/dev/null 2>&1; then
    need_build=1
elif [ "$want_rpc" = 1 ] && ! "$VENV/bin/python" -c \
        "import llama_cpp, sys; sys.exit(0 if llama_cpp.llama_supports_rpc() else 1)" >/dev/null 2>&1; then
    echo "setup: the installed llama-cpp-python lacks the RPC backend; reinstalling it with -DGGML_RPC=ON" >&2
    need_build=1
fi
have_cuda=$("$VENV/bin/python" -c "import importlib.util as u, pathlib as p; s = u.find_spec('llama_cpp'); \
print(int(bool(s) and any(x.name.startswith('libggml-cuda') for d in s.submodule_search_locations \
for x in (p.Path(d) / 'lib').glob('*'))))" 2>/dev/null || echo 0)
if [ "$need_build" = 0 ] && [ "$have_cuda" != "$([ "$backend" = cuda ] && echo 1 || echo 0)" ]; then
    echo "setup: the installed llama-cpp-python is not a $backend build; reinstalling it" >&2
    need_build=1
fi
if [ "$need_build" = 1 ]; then
    wheel=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$wheel" ]; then
        echo "setup: building llama-cpp-python $LLAMA_VERSION ($CMAKE_ARGS; 3-15 minutes the first" \
            "time, then cached in $WHEELS)" >&2
        mkdir -p "$WHEELS"
        "$VENV/bin/python" -m pip wheel --quiet --no-deps --no-cache-dir -w "$WHEELS" \
            "llama-cpp-python==$LLAMA_VERSION"
        wheel=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl | head -1)
    fi
    "$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps "$wheel"
    "$VENV/bin/python" -m pip install --quiet "$wheel"
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

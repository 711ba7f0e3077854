#!/usr/bin/env bash
# Print the ggml CMake flags that work on this CPU (DESIGN.md §11): llama.cpp's default
# -march=native build segfaults in the AMX matmul path on this CPU class, so build without
# GGML_NATIVE: AVX-512 (+VNNI/BF16) where the CPU has it, else portable AVX2. Used by
# scripts/setup.sh (llama-cpp-python) and bench/peer.py (llama-server), so both builds match.
set -euo pipefail
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
if [[ " $flags " == *" avx512f "* ]]; then
    args="$args -DGGML_AVX512=ON"
    [[ " $flags " == *" avx512_vnni "* ]] && args="$args -DGGML_AVX512_VNNI=ON"
    [[ " $flags " == *" avx512_bf16 "* ]] && args="$args -DGGML_AVX512_BF16=ON"
fi
echo "$args"

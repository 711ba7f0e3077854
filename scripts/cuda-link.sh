#!/usr/bin/env bash
# Linker flags for llama.cpp's shared libraries, by name (issue 44: on an H200 machine every
# runner of a CUDA build died in llama_model::print_info, inside a copy of libstdc++'s stream
# code that libggml-cuda.so exported and libllama.so bound to). One definition, used by
# scripts/setup.sh (MODELD_CUDA_LINK, the CUDA build) and scripts/gpu-check.sh (relinks):
#   default       no extra flags (the build as llama.cpp makes it)
#   exclude-libs  -Wl,--exclude-libs,ALL: what the library took in from static archives
#                 (libstdc++.a, libcudart_static.a, ...) is not exported; code it instantiated
#                 itself (a template such as std::ostream::_M_insert<long>) still is
#   hide-std      a version script (scripts/hide-std.map) that keeps every std:: symbol local,
#                 from an archive or instantiated; the library's own API stays exported
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
case "${1:-default}" in
    default) echo "" ;;
    exclude-libs) echo "-Wl,--exclude-libs,ALL" ;;
    hide-std) echo "-Wl,--version-script=$HERE/hide-std.map" ;;
    --list) echo "default exclude-libs hide-std" ;;
    *) echo "cuda-link: unknown variant '$1' (default, exclude-libs, hide-std)" >&2; exit 2 ;;
esac

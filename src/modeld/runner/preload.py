"""Shared libraries a runner loads into its global symbol scope before llama.cpp (issue 44).

On an H200 machine every runner of a CUDA build died in ``llama_model::print_info``: libllama.so
had bound ``std::ostream::_M_insert<long>`` to a copy of libstdc++'s stream code exported by
libggml-cuda.so, not to libstdc++.so.6's. llama_cpp loads its libraries with RTLD_LOCAL, and a
Python executable does not link libstdc++, so libstdc++.so.6 is not in the global scope that
each lookup tries first. ``MODELD_RUNNER_PRELOAD=libstdc++.so.6`` puts it there (a candidate fix
that scripts/gpu-check.sh tries on a card); unset, nothing is loaded.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

#: The variable naming the libraries (separated by ':' or spaces), each loaded RTLD_GLOBAL.
ENV = "MODELD_RUNNER_PRELOAD"


def names(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The libraries ``environ`` asks for, in order."""
    return environ.get(ENV, "").replace(":", " ").split()


def preload(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Load each named library with RTLD_GLOBAL (before llama_cpp is imported); the names
    loaded. A name that does not load is an error naming the variable."""
    done = []
    for name in names(environ):
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise RuntimeError(f"{ENV}: cannot load {name!r} ({exc}): fix or unset {ENV}") from exc
        done.append(name)
    return done

"""``python -m modeld.runner``: see :mod:`modeld.runner.main`."""

import sys

# libzmq before llama_cpp: with a CUDA build of llama.cpp loaded first, libzmq's I/O thread
# dies on its first message (SIGSEGV in libstdc++; seen on an H200 machine, pyzmq 27.3).
import zmq  # noqa: F401

from modeld.runner.main import main

sys.exit(main())

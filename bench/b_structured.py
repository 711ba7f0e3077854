"""Schema-constrained decoding: its cost on modeld, and modeld beside llama.cpp's llama-server.

Same run, interleaved, the default model, greedy, streamed over OpenAI's chat API with a new
connection each: (1) modeld, a reply held to a JSON Schema (``response_format`` json_schema)
vs an unconstrained reply; (2) the same constrained request to modeld and to ``llama-server
--jinja`` (bench/peer.py, router mode, same model, context and threads). The rate is decode
tokens per second from the first streamed piece to the last (the prompt's evaluation left out).
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import peer
from harness import Context, daemon, free_port, interleave, sse_rate, summary, target

#: A reply of a few hundred tokens whose length the schema bounds (strings of at most 24
#: characters, exactly 8 items), so both servers write the same shape.
SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["cities"],
    "properties": {"cities": {"type": "array", "minItems": 8, "maxItems": 8, "items": {
        "type": "object", "additionalProperties": False,
        "required": ["name", "country", "population"],
        "properties": {"name": {"type": "string", "maxLength": 24},
                       "country": {"type": "string", "maxLength": 24},
                       "population": {"type": "integer", "minimum": 0}}}}},
}  # fmt: skip
ASK = "List eight large cities of the world with their country and population, as JSON."


def _rate(port: int, model: str, content: str, schema: dict[str, Any] | None,
          max_tokens: int) -> tuple[float, int]:
    """(decode tokens/s from the first streamed piece to the last, completion tokens)."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": content}],
                            "max_tokens": max_tokens, "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True}}
    if schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "cities", "schema": schema}}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"port {port}: {resp.status} {resp.read()[:300]!r}")
    rate, tokens, text = sse_rate(resp, lambda choice: choice["delta"].get("content"))
    if schema is not None:
        json.loads(text)  # the reply parses (a cut one would raise here)
    return rate, tokens


def structured(ctx: Context, max_tokens: int = 400) -> dict[str, Any]:
    port = free_port()
    model = ctx.model
    ours = str(model)
    counts: dict[str, list[int]] = {"schema": [], "free": [], "router": []}

    def run(name: str, p: int, m: str, content: str, schema: dict[str, Any] | None
            ) -> float:
        rate, n = _rate(p, m, content, schema, max_tokens)
        counts[name].append(n)
        return rate

    with daemon(env={"MODELD_HTTP": f"127.0.0.1:{port}"}) as d:
        n_ctx = int(d.client().load(ours)["n_ctx"])
        with peer.router([model], models_max=1, n_ctx=n_ctx, parallel=1, threads=ctx.threads,
                         extra=("--jinja",)) as router:
            router_port = int(router.url.rsplit(":", 1)[1])
            theirs = str(router.get("/v1/models")["data"][0]["id"])  # type: ignore[index]
            for _ in range(2):  # both warm: loaded, first-use costs paid
                run("schema", port, ours, ASK, SCHEMA)
                run("router", router_port, theirs, ASK, SCHEMA)
            for v in counts.values():
                v.clear()
            samples = interleave({
                "schema": lambda: run("schema", port, ours, ASK, SCHEMA),
                "free": lambda: run("free", port, ours, ASK, None),
                "router": lambda: run("router", router_port, theirs, ASK, SCHEMA),
            }, ctx.rounds)
    s, f, r = (summary(samples[k]) for k in ("schema", "free", "router"))
    cost = s["median"] / f["median"] if s["median"] and f["median"] else None
    peer_ratio = s["median"] / r["median"] if s["median"] and r["median"] else None
    return {
        "title": "Structured output",
        "what": "greedy decode tokens/s of a streamed chat reply held to a JSON Schema (8 "
        "objects of bounded strings and an integer) vs the unconstrained reply to the same "
        "question on modeld, and "
        "the same constrained request to llama-server --jinja (router, same model and n_ctx)",
        "model": model.name, "n_ctx": n_ctx, "threads": ctx.threads, "schema": SCHEMA,
        "schema_tokens_per_s": s, "free_tokens_per_s": f, "router_tokens_per_s": r,
        "constrained_over_free": cost, "ratio": peer_ratio,
        "tokens": {k: summary([float(x) for x in v]) for k, v in counts.items()},
        "samples": samples,
        "peer_command": "llama-server --models-dir DIR --models-max 1 -c "
        f"{n_ctx} --parallel 1 -t {ctx.threads} --jinja (bench/peer.py)",
        "targets": [
            target("schema-constrained / unconstrained decode tokens/s (modeld)", cost, 0.9,
                   ">="),
            target("schema-constrained decode tokens/s: modeld / llama-server", peer_ratio, 1.0,
                   ">="),
        ],
    }

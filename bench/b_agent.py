"""An agent's second turn: what Claude Code does to a local model every turn.

A Claude-Code-shaped conversation over the Anthropic Messages API (streamed, as Claude Code
always streams): a large system prompt with a per-request billing line (``cch=`` changes every
request) and tools, a first question, then the follow-up that carries the first reply. The
second turn's time to first token is measured against the first's: with the billing line
dropped before templating, the runner's prompt cache covers everything but the new turn.
"""

from __future__ import annotations

import http.client
import json
import random
import time
from typing import Any

from harness import Context, daemon, free_port, summary, target

_VOCAB = ("river", "stone", "market", "window", "garden", "silver", "morning", "letter",
          "forest", "engine", "harbor", "lantern", "mountain", "quiet", "yellow", "paper",
          "bridge", "candle", "orchard", "thunder", "file", "edit", "search", "command",
          "careful", "always", "never", "test", "commit", "branch")  # fmt: skip


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


def billing_line(rng: random.Random) -> str:
    """Claude Code's per-request stamp: the ``cch`` value changes every request."""
    return (f"x-anthropic-billing-header: cc_version=2.1.37.{rng.randrange(1 << 12):03x}; "
            f"cc_entrypoint=cli; cch={rng.randrange(1 << 20):05x};")


def conversation(seed: int, words: int, n_tools: int = 12) -> dict[str, Any]:
    """The first turn's body: system blocks (billing line first), tools, one question."""
    rng = random.Random(seed)
    tools = [{
        "name": f"tool_{i}",
        "description": _words(rng, 60),
        "input_schema": {"type": "object", "properties": {
            "path": {"type": "string", "description": _words(rng, 12)},
            "limit": {"type": "integer", "description": _words(rng, 8)}},
            "required": ["path"]},
    } for i in range(n_tools)]  # fmt: skip
    paragraphs = [_words(rng, 100) for _ in range(max(1, words // 100))]
    return {
        "model": "default", "max_tokens": 8, "stream": True, "tools": tools,
        "system": [{"type": "text", "text": billing_line(rng)},
                   {"type": "text", "text": "You are a coding agent.\n\n" + "\n\n".join(paragraphs),
                    "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "Which file holds the main loop?"}],
        "metadata": {"user_id": "bench"},
    }  # fmt: skip


def follow_up(first: dict[str, Any], reply: str, seed: int) -> dict[str, Any]:
    """The second turn: the first reply and a new question, under a new billing line."""
    rng = random.Random(seed + 1_000_003)
    system = [{"type": "text", "text": billing_line(rng)}, *first["system"][1:]]
    messages = [*first["messages"], {"role": "assistant", "content": reply or "(nothing)"},
                {"role": "user", "content": "And where is it tested?"}]
    return {**first, "system": system, "messages": messages}


def stream(port: int, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed /v1/messages request: time to the first content delta, the text, usage."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.perf_counter()
    conn.request("POST", "/v1/messages?beta=true", json.dumps(body),
                 {"Content-Type": "application/json", "anthropic-version": "2023-06-01"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"/v1/messages: {resp.status} {resp.read()[:300]!r}")
    ttft = None
    text: list[str] = []
    usage: dict[str, Any] = {}
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        event = json.loads(line[6:])
        if event["type"] == "message_start":  # llama-server counts the prompt only here
            usage = dict(event["message"].get("usage") or {})
        elif event["type"] == "content_block_delta":
            ttft = ttft if ttft is not None else time.perf_counter() - started
            text.append(event["delta"].get("text", ""))
        elif event["type"] == "message_delta":
            usage = {**usage, **event["usage"]}
            ttft = ttft if ttft is not None else time.perf_counter() - started
    conn.close()
    return {"ttft_s": ttft, "text": "".join(text), "usage": usage}


def count(port: int, body: dict[str, Any]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    doc = {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}
    conn.request("POST", "/v1/messages/count_tokens", json.dumps(doc),
                 {"Content-Type": "application/json"})
    n = int(json.loads(conn.getresponse().read())["input_tokens"])
    conn.close()
    return n


def agent_turns(ctx: Context, words: int = 6500, rounds: int = 3) -> dict[str, Any]:
    port = free_port()
    n_tools = 12
    if ctx.smoke:  # the tiny generated model: a 512-token context
        words, rounds, n_tools = 60, 1, 1
    model = str(ctx.model)  # a path is a model name on the HTTP APIs too
    rows = []
    with daemon(env={"MODELD_HTTP": f"127.0.0.1:{port}"}) as d:
        d.client().load(model)
        for r in range(rounds):  # a fresh system prompt each round: nothing reused across
            first = {**conversation(r, words, n_tools), "model": model}
            one = stream(port, first)
            second = follow_up(first, one["text"], r)
            two = stream(port, second)
            rows.append({"first_prompt_tokens": count(port, first),
                         "second_prompt_tokens": count(port, second),
                         "first": one, "second": two,
                         "ratio": two["ttft_s"] / one["ttft_s"]})  # fmt: skip
            ctx.log(f"   round {r}: {rows[-1]['first_prompt_tokens']} tokens, TTFT "
                    f"{one['ttft_s']:.2f} s -> {two['ttft_s']:.3f} s; second turn evaluated "
                    f"{two['usage'].get('input_tokens')}, cached "
                    f"{two['usage'].get('cache_read_input_tokens')}")
    ratio = summary([r["ratio"] for r in rows])["median"]
    return {
        "title": "Agent turns (Anthropic Messages API)",
        "what": "a Claude-Code-shaped conversation streamed over /v1/messages: a large system "
        f"prompt (its first line a billing stamp that changes every request) with {n_tools} "
        "tools, a "
        "question, then the follow-up carrying the first reply; time to the first content "
        "delta of the second turn / of the first, default sampling settings",
        "model": ctx.model.name,
        "first_prompt_tokens": summary([float(r["first_prompt_tokens"]) for r in rows]),
        "second_prompt_tokens": summary([float(r["second_prompt_tokens"]) for r in rows]),
        "first_ttft_s": summary([r["first"]["ttft_s"] for r in rows]),
        "second_ttft_s": summary([r["second"]["ttft_s"] for r in rows]),
        "second_evaluated_tokens": summary(
            [float(r["second"]["usage"]["input_tokens"]) for r in rows]),
        "second_cached_tokens": summary(
            [float(r["second"]["usage"]["cache_read_input_tokens"]) for r in rows]),
        "ratio": ratio,
        "rounds": rounds,
        "rounds_detail": rows,
        "targets": [target("second / first turn time to first token", ratio, 0.2, "<=")],
    }

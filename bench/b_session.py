"""A 10-turn agent session that outgrows its context (issue 36).

Claude Code's shape over the Anthropic Messages API (streamed): a ~17k-token system prompt and
tools on the default model (a billing line that changes every request first), then ten turns,
each adding the last reply, a tool result and a question (~1k tokens). The model is loaded
as the README advised before (``modeld load MODEL --ctx 24576 --parallel 1``), so the
conversation outgrows it at turn 9 and the daemon reloads it with a larger context. Measured
per turn: prompt tokens, tokens evaluated (``input_tokens``), tokens from the cache, time to
the first content delta, the context after. Target: each prefix evaluated once, i.e. all
turns together evaluate at most 1.1 x the final prompt. The control row runs the same session
with the prompt cache off (``prompt_cache_mib`` 0: no handoff across the reload, the growth
turn re-reads everything).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from b_agent import billing_line, conversation, count, stream
from harness import Context, daemon, free_port, target

TURN_WORDS = 900  # ~1k tokens a turn with the reply and the question (gemma's tokenizer)


def _turn(body: dict[str, Any], reply: str, turn: int, rng: random.Random,
          words: int = TURN_WORDS) -> dict[str, Any]:
    """The next request: the reply, a tool result of ``TURN_WORDS`` words, a new question,
    under a new billing line."""
    from b_agent import _words

    system = [{"type": "text", "text": billing_line(rng)}, *body["system"][1:]]
    call = f"toolu_{turn:04d}"
    messages = [*body["messages"],
                {"role": "assistant", "content": [
                    {"type": "text", "text": reply or "(nothing)"},
                    {"type": "tool_use", "id": call, "name": "tool_0",
                     "input": {"path": f"src/file_{turn}.py"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call,
                     "content": _words(rng, words)},
                    {"type": "text", "text": f"Step {turn}: what next?"}]}]  # fmt: skip
    return {**body, "system": system, "messages": messages}


def _turns(ctx: Context, port: int, body: dict[str, Any], turns: int, turn_words: int,
           n_ctx: Callable[[], int]) -> list[dict[str, Any]]:
    """The session's turns against the server on ``port``: per turn its prompt, what was
    evaluated and what came from the cache (the server's ``usage``), the TTFT, the context."""
    rows: list[dict[str, Any]] = []
    rng = random.Random(7)
    for turn in range(turns):
        if turn:
            body = _turn(body, rows[-1]["text"], turn, rng, turn_words)
        one = stream(port, body)
        usage = one["usage"]
        rows.append({"turn": turn + 1, "prompt_tokens": count(port, body),
                     "evaluated": int(usage["input_tokens"]),
                     "cached": int(usage.get("cache_read_input_tokens") or 0),
                     "ttft_s": one["ttft_s"], "n_ctx": n_ctx(), "text": one["text"]})  # fmt: skip
        ctx.log(f"   turn {turn + 1}: {rows[-1]['prompt_tokens']} tokens, evaluated "
                f"{rows[-1]['evaluated']}, cached {rows[-1]['cached']}, TTFT "
                f"{one['ttft_s']:.2f} s, n_ctx {rows[-1]['n_ctx']}")
    return rows


def _totals(rows: list[dict[str, Any]], t0: float, reloads: int) -> dict[str, Any]:
    evaluated = sum(r["evaluated"] for r in rows)
    final = rows[-1]["evaluated"] + rows[-1]["cached"]
    return {"turns": [{k: v for k, v in r.items() if k != "text"} for r in rows],
            "evaluated_total": evaluated, "final_prompt": final,
            "ratio": evaluated / final, "total_s": time.perf_counter() - t0,
            "reloads": reloads}  # fmt: skip


def _first(ctx: Context, words: int, tools: int = 12) -> tuple[dict[str, Any], int]:
    """The first turn's body and the words a later turn adds (smoke: tiny ones)."""
    n_tools, turn_words = (min(1, tools), 60) if ctx.smoke else (tools, TURN_WORDS)
    body = {**conversation(7, words, n_tools), "model": str(ctx.model), "max_tokens": 16}
    return body, turn_words


def _session(ctx: Context, words: int, turns: int, ctx_tokens: int, *flags: str,
             tools: int = 12) -> dict[str, Any]:
    body, turn_words = _first(ctx, words, tools)
    port = free_port()
    t0 = time.perf_counter()
    with daemon(*flags, env={"MODELD_HTTP": f"127.0.0.1:{port}"}) as d:
        c = d.client(timeout=900)
        c.load(str(ctx.model), n_ctx=ctx_tokens, parallel=1, keep_alive="1h")

        def n_ctx() -> int:
            (row,) = [r for r in c.ps() if r["state"] != "unloading"]
            return int(row["n_ctx"])

        rows = _turns(ctx, port, body, turns, turn_words, n_ctx)
        stats = c.stats()
    return _totals(rows, t0, int(stats["evictions"].get("reload", 0)))


def _peer_session(ctx: Context, words: int, turns: int, ctx_tokens: int,
                  tools: int) -> dict[str, Any]:
    """The same session against ``llama-server --jinja`` on the same file, its context set
    large enough for the whole session up front (it cannot grow one)."""
    import peer

    body, turn_words = _first(ctx, words, tools)
    t0 = time.perf_counter()
    with peer.server("-m", str(ctx.model), "--jinja", "-c", str(ctx_tokens), "--parallel", "1",
                     "-t", str(ctx.threads)) as srv:  # fmt: skip
        port = int(srv.url.rsplit(":", 1)[1])
        rows = _turns(ctx, port, body, turns, turn_words, lambda: ctx_tokens)
    return _totals(rows, t0, 0)


def agent_session(ctx: Context, words: int = 15000, turns: int = 10) -> dict[str, Any]:
    ctx_tokens = 24576
    if ctx.smoke:  # the tiny generated model (512-token context): two short turns
        words, turns, ctx_tokens = 60, 2, 512
    carried = _session(ctx, words, turns, ctx_tokens)
    control = _session(ctx, words, turns, ctx_tokens, "--prompt-cache-mib", "0")
    return {
        "title": "Agent session across a context growth (Anthropic Messages API)",
        "what": f"a {turns}-turn Claude-Code-shaped session streamed over /v1/messages (a "
        "~17k-token system prompt with 12 tools, ~1k tokens more a turn: the reply, a tool "
        f"result, a question), the model loaded with --ctx {ctx_tokens} --parallel 1 so the "
        "session outgrows it; tokens evaluated over all turns / the final prompt; control: "
        "the same with the prompt cache off (no handoff across the reload)",
        "model": ctx.model.name,
        "carried": carried,
        "control": control,
        "targets": [target("all turns' evaluated tokens / final prompt",
                           carried["ratio"], 1.1, "<=")],
    }


def agent_session_peer(ctx: Context, words: int = 1000, turns: int = 6) -> dict[str, Any]:
    """A shorter session (a ~3k-token first prompt, six turns, so llama-server's re-reads stay
    within minutes on a busy 2-core box): modeld from --ctx 4096 (it grows on the way) vs
    llama-server --jinja with -c 8192, the context modeld ends at, from the start."""
    ours, theirs = 4096, 8192
    if ctx.smoke:
        words, turns, ours, theirs = 60, 2, 512, 1024
    # no tools: llama-server's --jinja rendering of this model's template (no tool support)
    # leaves them out, modeld's puts them in the prompt; without them both read the same text
    modeld = _session(ctx, words, turns, ours, tools=0)
    server = _peer_session(ctx, words, turns, theirs, tools=0)
    return {
        "title": "Agent session: modeld vs llama-server --jinja (Anthropic Messages API)",
        "what": f"the agent_session shape with a ~{words}-word system prompt (no tools: "
        "llama-server's template rendering drops them for this model, so both read the same "
        "text), "
        f"{turns} turns streamed over /v1/messages (Claude Code's per-request billing line "
        f"first in the system prompt); modeld loaded with --ctx {ours} --parallel 1 (it grows "
        f"during the session), llama-server -m FILE --jinja -c {theirs} --parallel 1; "
        "tokens evaluated over all turns (the servers' usage.input_tokens) and the session's "
        "wall time",
        "model": ctx.model.name,
        "modeld": modeld,
        "llama_server": server,
        "targets": [target("modeld: all turns' evaluated tokens / final prompt",
                           modeld["ratio"], 1.1, "<="),
                    target("modeld session time / llama-server's",
                           modeld["total_s"] / server["total_s"], 1.0, "<=")],
    }

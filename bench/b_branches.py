"""An agent conversation that branches back and compacts (issue 47).

Claude Code's shape over the Anthropic Messages API (streamed, sampled as it sends it) on the
default model (gemma-3-270m: sliding-window layers, ``swa_full`` off): a system prompt and
tools, two appended turns of ~1k tokens each (the reply, a tool result, a question), then a
*branch* back past both (the first turn's tool result rewritten: an earlier message edited),
then a *compaction* (the system part kept, the history replaced by a summary). Measured per
turn: prompt tokens, tokens evaluated (``input_tokens``), tokens from the cache
(``cache_read_input_tokens``), time to the first content delta. Target: every turn reuses its
common prefix with what was evaluated before, less at most one window (512 tokens for
gemma-3). The control row runs the same script with the prompt cache off
(``prompt_cache_mib`` 0: no context checkpoints, the branch and the compaction re-read all).
"""

from __future__ import annotations

import random
from typing import Any

from b_agent import _words, billing_line, conversation, count, stream
from b_session import _turn
from harness import Context, daemon, free_port, target

TURN_WORDS = 900  # ~1k tokens a turn with the reply and the question (gemma's tokenizer)
WINDOW = 512  # gemma-3's sliding window: what a turn may evaluate again at most


def _script(first: dict[str, Any], rng: random.Random, turn_words: int,
            replies: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """The bodies in order, built from the replies so far (``replies`` grows as they come)."""
    one = _turn(first, replies[0], 1, rng, turn_words)
    two = _turn(one, replies[1] if len(replies) > 1 else "", 2, rng, turn_words)
    branch = _turn(first, replies[0], 1, random.Random(99), turn_words)  # turn 1 rewritten
    system = [{"type": "text", "text": billing_line(rng)}, *first["system"][1:]]
    summary = {"role": "user", "content": "Summary of the conversation so far: "
               + _words(rng, min(120, turn_words)) + "\nGo on from there."}
    compacted = {**first, "system": system, "messages": [summary]}
    return [("append", one), ("append", two), ("branch", branch), ("compaction", compacted)]


def _run(ctx: Context, words: int, *flags: str) -> tuple[list[dict[str, Any]], int]:
    """The turns' rows, and the tokens of the system part alone (what compaction keeps)."""
    turn_words = 15 if ctx.smoke else TURN_WORDS
    first = {**conversation(7, words, 1 if ctx.smoke else 12), "model": str(ctx.model),
             "max_tokens": 16}
    port = free_port()
    rows: list[dict[str, Any]] = []
    with daemon(*flags, env={"MODELD_HTTP": f"127.0.0.1:{port}"}) as d:
        c = d.client(timeout=900)
        c.load(str(ctx.model), n_ctx=2048 if ctx.smoke else 16384, parallel=1, keep_alive="1h")
        replies: list[str] = []
        bodies = [("first", first)]
        for i in range(5):
            kind, body = bodies[i]
            one = stream(port, body)
            replies.append(one["text"])
            usage = one["usage"]
            rows.append({"turn": i + 1, "kind": kind, "prompt_tokens": count(port, body),
                         "evaluated": int(usage["input_tokens"]),
                         "cached": int(usage.get("cache_read_input_tokens") or 0),
                         "ttft_s": one["ttft_s"]})  # fmt: skip
            ctx.log(f"   {kind}: {rows[-1]['prompt_tokens']} tokens, evaluated "
                    f"{rows[-1]['evaluated']}, cached {rows[-1]['cached']}, TTFT "
                    f"{one['ttft_s']:.2f} s")
            if i == 0 or i == 1:
                bodies = [("first", first), *_script(first, random.Random(7), turn_words,
                                                     replies)]
        system = count(port, {**first, "messages": [{"role": "user", "content": "x"}]})
    return rows, system


def agent_branches(ctx: Context, words: int = 3000) -> dict[str, Any]:
    """The script with the prompt cache (its context checkpoints) and without it."""
    words = 30 if ctx.smoke else words
    ctx.log(" agent_branches: prompt cache on (context checkpoints)")
    on, system = _run(ctx, words)
    ctx.log(" agent_branches: prompt cache off")
    off, _ = _run(ctx, words, "--prompt-cache-mib", "0")
    by_kind = {r["kind"]: r for r in on}
    # the branch shares at least the first prompt, the compaction the system part (a few
    # tokens of the placeholder question less)
    branch_short = on[0]["prompt_tokens"] - by_kind["branch"]["cached"]
    compaction_short = system - 8 - by_kind["compaction"]["cached"]
    return {"title": "agent conversation: appended turns, a branch back, a compaction",
            "words": words, "system_tokens": system, "turns": on, "control_cache_off": off,
            "evaluated_total": sum(r["evaluated"] for r in on),
            "evaluated_total_off": sum(r["evaluated"] for r in off),
            "targets": [
                target("branch: common prefix not reused (tokens)", branch_short, WINDOW, "<="),
                target("compaction: common prefix not reused (tokens)", compaction_short,
                       WINDOW, "<=")]}

"""Every turn of a conversation reuses its longest cached prefix, however far back it branches
(issue 47): a full-attention model cuts its live cells back to the branch point; a
sliding-window model, whose live cells no longer hold the window before an old point, restores
the nearest context checkpoint at or before it (runner/promptcache.py), so a turn evaluates at
most one window more than what is new. Greedy replies stay those of a cold evaluation. Real
daemon, real runners, generated models; the scripted turns of an agent: appended turns, a
branch far back (an earlier message rewritten) and a compaction (the system part kept, the
history replaced by a summary)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import ggufgen

Factory = Callable[..., Any]
#: a 128-token window (one aligned piece), so checkpoints come every piece
WINDOWED = dict(ggufgen.SWA, sliding_window=128, context_length=8192)
FULL = dict(ggufgen.TINY, context_length=8192)
SYSTEM = "You are a careful agent with tools for stones, rivers and maps.\n" * 12
HISTORY = [f"turn {i}: the user asked about river {i} and the tool answered with stones.\n" * 6
           for i in range(8)]


def _tokens(client: Any, model: str, text: str) -> int:
    gen = client.generate(model, text, raw=True, count_only=True)
    gen.text()
    assert gen.done is not None
    return int(gen.done["usage"]["prompt_tokens"])


def _turn(client: Any, model: str, prompt: str, **opts: Any) -> tuple[str, dict[str, Any]]:
    gen = client.generate(model, prompt, raw=True, max_tokens=6, **opts)
    text = gen.text()
    assert gen.done is not None
    return text, dict(gen.done["usage"])


@pytest.mark.parametrize("kind,params,window", [("gemma3", WINDOWED, 128), ("llama", FULL, 0)])
@pytest.mark.parametrize("greedy", [False, True])
def test_every_turn_reuses_all_but_a_window_of_its_common_prefix(
    daemon_factory: Factory, model_factory: Factory, kind: str, params: dict[str, Any],
    window: int, greedy: bool,
) -> None:  # fmt: skip
    model = str(model_factory(kind, **params))
    d = daemon_factory()
    c = d.client()
    c.load(model, n_ctx=8192, parallel=1)
    opts: dict[str, Any] = dict(temperature=0.0) if greedy else dict(temperature=0.8, seed=7)
    whole = SYSTEM + "".join(HISTORY)
    branched = SYSTEM + "".join(HISTORY[:2]) + "turn 2, rewritten: the user changed the map.\n"
    compacted = SYSTEM + "Summary of the conversation so far: rivers were counted.\n"
    turns = [  # (prompt, its common prefix with what the cache holds)
        (SYSTEM + "".join(HISTORY[:4]), ""),
        (whole, SYSTEM + "".join(HISTORY[:4])),  # appended to
        (branched, SYSTEM + "".join(HISTORY[:2])),  # an earlier message rewritten: ~600 back
        (compacted, SYSTEM),  # compaction
    ]
    replies = []
    for prompt, common in turns:
        text, usage = _turn(c, model, prompt, **opts)
        replies.append(text)
        shared = _tokens(c, model, common) if common else 0
        # a token or two at the seam may tokenize otherwise; greedy requests reuse up to an
        # aligned piece boundary (128) of a stable prefix, and restore no checkpoint (their
        # replies must not depend on the cache): on a windowed model only the live cells
        if greedy and window:
            continue
        slack = 2 + max(window, 128 if greedy else 0)
        assert usage["prompt_tokens_reused"] >= shared - slack, (prompt[-60:], shared, usage)
        if shared > slack:
            assert usage["prompt_tokens_reused"] > 0
    if greedy:  # each turn's reply from a fresh runner with no prompt cache
        cold = daemon_factory("--prompt-cache-mib", "0")
        f = cold.client()
        for (prompt, _), text in zip(turns, replies, strict=True):
            f.load(model, n_ctx=8192, parallel=1)
            again, usage = _turn(f, model, prompt, **opts)
            assert usage["prompt_tokens_reused"] == 0 and again == text, prompt[-60:]
            f.unload(model)

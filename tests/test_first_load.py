"""An agent's first request loads its model once, at a context its prompt fits (issue 47: the
first request of Claude Code, 19k tokens of system prompt and tools, loaded 8,192 and then
32,768), and ``ctx_reason`` says why (a growth's reason: tests/test_handoff.py). Real daemon, real
runner, the default model (gemma-3-270m, trained for 32,768; a real tokenizer, ~4 bytes a
token of English), prompts counted and never evaluated (``count_only``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemonutil import rows
from modeld.config import prompt_cache_auto

Factory = Callable[..., Any]
WORDS = ("the river carries stones past the old mill while the keeper counts boats and "
         "writes their names in a ledger by the window ")


def _count(client: Any, model: str, text: str) -> dict[str, Any]:
    gen = client.generate(model, text, raw=True, count_only=True)
    gen.text()
    assert gen.done is not None
    return dict(gen.done)


def test_a_long_first_prompt_loads_once_at_a_context_it_fits(daemon_factory: Factory,
                                                           default_model: Path) -> None:
    d = daemon_factory("--memory-cap", str(8 << 30), env={"MODELD_PROMPT_CACHE_MIB": "auto"})
    c = d.client()
    model = str(default_model)
    # the automatic prompt cache (snapshots and checkpoints): a share of the memory budget
    budget = int(c.stats()["budget_bytes"])
    assert c.show(model)["estimate"]["prompt_cache"] == prompt_cache_auto(budget) >= 32 << 20
    first = WORDS * 400  # ~46 KB: about 10k tokens, over the automatic 8,192
    done = _count(c, model, first)
    assert 8192 < done["usage"]["prompt_tokens"] < 16384, done["usage"]
    (row,) = rows(c).values()
    assert row["n_ctx"] == 16384 and row["ctx_reason"].startswith("sized for a first prompt")
    loads = {line for line in d.log_text().splitlines() if "modeld.daemon: loading " in line}
    assert len(loads) == 1, loads  # one load, not 8,192 and then more
    # a prompt the automatic context holds: the automatic context, as before
    short = daemon_factory("--memory-cap", str(8 << 30))
    s = short.client()
    _count(s, model, WORDS * 20)
    (row,) = rows(s).values()
    assert row["n_ctx"] <= 8192 and not row["ctx_reason"].startswith("sized for")

"""A reply that reaches the end of its context goes on in a larger one (issue 36): the runner
stops it with its tokens, the daemon reloads the model with a larger context (the cells carried
by the handoff) and the runner continues the reply from where it stopped. A greedy reply is the
one a context large enough from the start gives. Real daemon, real runners, a generated model."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import ggufgen
from daemonutil import rows

Factory = Callable[..., Any]
MODEL = dict(ggufgen.TINY, context_length=2048)
PROMPT = "a prompt about stones and rivers " * 6


def _write(client: Any, model: str, max_tokens: int, prompt: str = PROMPT
           ) -> tuple[str, dict[str, Any], list[str]]:  # fmt: skip
    gen = client.generate(model, prompt, raw=True, max_tokens=max_tokens, temperature=0.0)
    parts = list(gen)
    assert gen.done is not None
    return "".join(parts), dict(gen.done), parts


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_reply_grows_its_context_and_stays_the_same(daemon_factory: Factory,
                                                      model_factory: Factory,
                                                      parallel: int) -> None:
    model = str(model_factory("llama", **MODEL))
    d = daemon_factory()
    c = d.client(timeout=300)
    c.load(model, n_ctx=256, parallel=parallel)
    beside: dict[str, Any] = {}
    if parallel == 2:  # a short reply decodes beside it; the reload waits for it to end
        other = d.client(timeout=300)
        thread = threading.Thread(target=lambda: beside.update(
            done=_write(other, model, 40, "another prompt, short ")[1]))
        thread.start()
    text, done, _ = _write(c, model, 700)
    if parallel == 2:
        thread.join(300)
        assert beside["done"]["usage"]["completion_tokens"] == 40
    assert done["usage"]["completion_tokens"] == 700, done  # past the 256 cells it began in
    assert done["finish_reason"] == "length" and done["length_reason"] == "max_tokens"
    assert done["n_ctx"] == 1024 and 40 < done["usage"]["prompt_tokens"] < 200  # doubled twice
    assert done["usage"]["prompt_tokens_reused"] == 0  # the first part's count, not the resume's
    (row,) = rows(c).values()
    assert row["n_ctx"] == 1024
    logs = "".join(p.read_text() for p in d.log_dir.glob("runner-*.log"))
    assert "tokens written for the reload" in logs and "tokens restored" in logs
    assert "goes on in n_ctx 1024" in d.log_text()

    fresh = daemon_factory("--prompt-cache-mib", "0")
    f = fresh.client(timeout=300)
    f.load(model, n_ctx=1024, parallel=parallel)
    again, done_again, _ = _write(f, model, 700)
    assert again == text  # greedy: as in a context large enough from the start
    assert done_again["usage"]["completion_tokens"] == 700


def test_a_reply_at_the_training_context_ends_with_the_reason(daemon_factory: Factory,
                                                              model_factory: Factory) -> None:
    """Growth up to the training context, then the honest stop: the whole reply, held-back
    text included, and the same text as a daemon that starts at that context."""
    model = str(model_factory("llama", **dict(MODEL, context_length=512)))
    d = daemon_factory()
    c = d.client(timeout=300)
    c.load(model, n_ctx=256, parallel=1)
    text, done, _ = _write(c, model, 2000)
    assert done["finish_reason"] == "length" and done["length_reason"] == "context_window"
    assert done["n_ctx"] == 512
    written = done["usage"]["completion_tokens"]
    assert 512 - 200 < written < 512 - 40
    fresh = daemon_factory("--prompt-cache-mib", "0")
    f = fresh.client(timeout=300)
    f.load(model, n_ctx=512, parallel=1)
    again, done_again, _ = _write(f, model, 2000)
    assert (again, done_again["usage"]["completion_tokens"]) == (text, written)


def test_a_reply_without_an_output_limit_does_not_grow_the_context() -> None:
    """Codex sends no output limit: such a reply ends at its context's end (finish
    ``length``), as Ollama ends one without ``num_predict``, instead of growing the context
    again and again while a model repeats itself; a request's own limit may grow it."""
    from modeld.daemon.dispatch import reply_may_grow
    from modeld.wire.options import MAX_TOKENS

    assert not reply_may_grow({"max_tokens": MAX_TOKENS})  # the APIs' "no limit"
    assert not reply_may_grow({})
    assert reply_may_grow({"max_tokens": 32000})  # Claude Code's own limit

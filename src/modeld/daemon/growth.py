"""Context growth (issue 36): a prompt, or a reply, that outgrew its model's loaded context
goes on in a larger one when memory allows.

The new context is sized as the model's load was placed (its layers on the cards, or on RPC
workers), with headroom (:func:`modeld.sizing.context_for_prompt`); the request is then queued
again at the head of its model's queue (:class:`modeld.daemon.dispatch.Dispatch` does that), and
the reload that follows hands the sequences' cells over (runner/handoff.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from modeld import sizing
from modeld.cache.policy import CachePolicy, ModelKey
from modeld.config import Settings
from modeld.daemon.jobs import Job, Slot, joined
from modeld.errors import ContextExceededError
from modeld.model import placement

log = logging.getLogger("modeld.daemon")

#: Prompt bytes per token assumed when a first load is sized from a request's length, before
#: any tokenizer ran (English and code with BPE vocabularies: 3-4.5 bytes a token; counting
#: JSON's quoting too, 4 rarely overshoots by a doubling).
BYTES_PER_TOKEN = 4
#: The fields of a generate request whose text becomes prompt tokens.
PROMPT_FIELDS = ("prompt", "system", "messages", "tools")

#: Where a load of a model goes (its KV type, its cards): admission.Admission.where.
WhereOf = Callable[[ModelKey, str, list[Job]], placement.Where]


class Growth:
    """Sizes the larger context of a request that outgrew its model's."""

    def __init__(self, settings: Settings, cache: CachePolicy) -> None:
        self.settings = settings
        self.cache = cache
        self.where_of: WhereOf | None = None  # None: the loads are on the CPU

    def first_load(self, info: Any, name: str, key: ModelKey, baseline: int, jobs: list[Job],
                   parallel: int) -> tuple[int, str] | None:
        """(n_ctx, reason) for a load whose first request is longer than the automatic context
        would hold (an agent's 19k-token system prompt and tools), so it loads once at the size
        growth would reach (doubling, as :meth:`for_prompt`) instead of at the automatic
        context and then again; None: the automatic context will do."""
        guess = max((guess_tokens(j.payload) for j in jobs if j.kind == "generate"), default=0)
        if guess <= self.settings.ctx_ceiling:
            return None
        try:
            n_ctx = sizing.context_for_prompt(
                info, name, key, self.cache, baseline, self.settings, guess, 1024, parallel,
                current=self.settings.ctx_ceiling)
        except ContextExceededError:
            return None  # the load goes ahead as usual; the runner counts it exactly
        return n_ctx, f"sized for a first prompt of about {guess} tokens (from its length)"

    def for_prompt(self, slot: Slot, job: Job, err: ContextExceededError,
                   baseline: int) -> ContextExceededError | bool:
        """A prompt over the context: True when ``job`` has its larger ``n_ctx`` (queue it
        again), the error to end it with when none fits, False when ``err`` carries no token
        count or the job grew twice already (``err`` is then its answer)."""
        prompt_tokens = err.details.get("prompt_tokens")
        if not isinstance(prompt_tokens, int) or job.ctx_retries >= 2:
            return False
        try:
            job.n_ctx = sizing.context_for_prompt(
                slot.info, slot.name, slot.key, self.cache, baseline, self.settings,
                prompt_tokens, int(job.payload.get("max_tokens", 256)), slot.planned_parallel,
                current=loaded if isinstance(loaded := err.details.get("n_ctx"), int) else 0,
                unified=slot.kv_unified, **self._placed(slot, job),
            )  # fmt: skip
        except ContextExceededError as exc:
            exc.details.setdefault("n_ctx", err.details.get("n_ctx"))
            if err.details.get("prompt_tokens_at_least"):  # counted from its bytes, a bound
                exc.message = exc.message.replace(f"has {prompt_tokens} tokens",
                                                  f"has at least {prompt_tokens} tokens")
                exc.details["prompt_tokens_at_least"] = True
            # a value now, not raised: without its traceback, whose frames (this one, and the
            # caller's holding the returned error) would form a cycle that keeps the request's
            # payload (a 10 MB prompt) resident until the collector runs
            return exc.with_traceback(None)
        job.ctx_retries += 1
        job.ctx_why = f"grown to {job.n_ctx} for a {prompt_tokens}-token prompt"
        log.info("%s: %d prompt tokens need n_ctx %d", slot.name, prompt_tokens, job.n_ctx)
        return True

    def for_reply(self, slot: Slot, job: Job, msg: dict[str, Any], resume: list[Any],
                  loaded: int, baseline: int) -> None:
        """A reply that ran out of cells (runner/resume.py): ``job`` goes on writing it, in a
        larger context when one fits, else where it is, to end there (``grow`` false)."""
        job.earlier = joined(job.earlier, msg) if job.earlier is not None else msg
        written = len(resume)
        prompt = int(msg.get("usage", {}).get("prompt_tokens", 0)) + written
        try:
            n_ctx = sizing.context_for_prompt(
                slot.info, slot.name, slot.key, self.cache, baseline, self.settings, prompt,
                max(1, int(job.payload.get("max_tokens", 256)) - written), slot.planned_parallel,
                current=loaded, unified=slot.kv_unified, **self._placed(slot, job),
            )  # fmt: skip
        except ContextExceededError as exc:
            log.info("%s: a reply of %d tokens ends at n_ctx %d: %s", slot.name, written,
                     loaded, exc.message)
            n_ctx = loaded
        grow = n_ctx > loaded
        if grow:
            job.n_ctx = n_ctx
            job.ctx_why = f"grown to {n_ctx} for a reply past {loaded} tokens"
            log.info("%s: a reply of %d tokens goes on in n_ctx %d", slot.name, written, n_ctx)
        job.payload = dict(job.payload, resume=resume, grow=grow)

    def _placed(self, slot: Slot, job: Job) -> dict[str, Any]:
        """How a larger context for ``slot`` is charged: to RPC workers, or with its layers on
        the cards as its load placed them (context_for_prompt's ``offload`` and ``where``)."""
        if slot.rpc or self.where_of is None:
            return {"offload": bool(slot.rpc)}
        return {"where": self.where_of(slot.key, slot.name, [job])}


def guess_tokens(payload: dict[str, Any]) -> int:
    """A rough token count of a generate request's prompt from its length in bytes."""
    size = 0
    for name in PROMPT_FIELDS:
        value = payload.get(name)
        if isinstance(value, str):
            size += len(value.encode("utf-8", "replace"))
        elif value is not None:
            size += len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8",
                                                                                   "replace"))
    return size // BYTES_PER_TOKEN

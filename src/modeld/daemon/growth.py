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
from modeld.model.modelinfo import ModelInfo
from modeld.wire import reqparse

log = logging.getLogger("modeld.daemon")

#: Prompt bytes per token assumed when a first load is sized from a request's length, before
#: any tokenizer ran (English and code with BPE vocabularies: 3-4.5 bytes a token; counting
#: JSON's quoting too, 4 rarely overshoots by a doubling).
BYTES_PER_TOKEN = 4
#: The fields of a generate request whose text becomes prompt tokens.
PROMPT_FIELDS = ("prompt", "system", "messages", "tools")

#: Where a load of a model goes (its KV type, its cards): admission.Admission.where.
WhereOf = Callable[[ModelKey, str, list[Job]], placement.Where]
#: Prompts shorter than this are never sized from their bytes here (the runner counts them).
FROM_BYTES = 1 << 16
_SPACES = b" \t\n\r\x0b\x0c"


def too_long(req: reqparse.GenerateRequest, info: ModelInfo, name: str
             ) -> ContextExceededError | None:
    """The refusal of a prompt whose bytes alone prove it can never fit ``info``'s training
    context, before it waits for one of the model's sequences (a 5 MB prompt waited 122 s
    behind a stream on a one-sequence model for its runner to refuse it). The text counted is
    the raw prompt, else the longest user message (a chat template renders it), without
    whitespace (a special token may swallow what follows it); no token of an SPM or
    byte-level BPE vocabulary decodes to more bytes than its stored text
    (``token_bytes_max``)."""
    longest, train = info.token_bytes_max, info.context_length
    if req.count_only or not longest or not train:
        return None
    texts = [req.prompt] if req.prompt else [m.content for m in req.messages or ()
                                              if m.role == "user"]  # fmt: skip
    text = max(texts, key=len, default="")
    if len(text) < FROM_BYTES:
        return None
    data = text.encode("utf-8", "surrogatepass")
    least = (len(data) - sum(data.count(c) for c in _SPACES)) // longest
    if least < train:
        return None
    return ContextExceededError(
        f"the prompt has at least {least} tokens but {name} was trained for {train} at most",
        hint="shorten the prompt",
        details={"prompt_tokens": least, "prompt_tokens_at_least": True, "n_ctx_train": train})


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
            n_ctx = sizing.context_for_prompt(
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
        loaded = err.details.get("n_ctx")
        if err.details.get("prompt_tokens_at_least") and job.kind == "generate":
            # only a bound from its bytes, which a larger context might hold: the runner it
            # has counts it exactly first (tokenized, evaluated never), so a prompt that can
            # never fit is refused without a reload (a 400 KB one was "at least 8,333" tokens,
            # reloaded the model into 16,384 and then counted 88,887)
            job.counting = loaded if isinstance(loaded, int) else 0
            job.payload = dict(job.payload, count_only=True)
            log.info("%s: a prompt of at least %d tokens is counted before a reload",
                     slot.name, prompt_tokens)
            return True
        job.n_ctx = n_ctx
        job.ctx_retries += 1
        job.ctx_why = f"grown to {job.n_ctx} for a {prompt_tokens}-token prompt"
        log.info("%s: %d prompt tokens need n_ctx %d", slot.name, prompt_tokens, job.n_ctx)
        return True

    @staticmethod
    def counted(job: Job, msg: dict[str, Any]) -> ContextExceededError:
        """The count a ``counting`` ``job``'s runner sent (its count_only done) as the refusal
        it stands for; the job is a plain one again."""
        loaded, job.counting = job.counting or 0, None
        job.payload = {k: v for k, v in job.payload.items() if k != "count_only"}
        tokens = int(msg.get("usage", {}).get("prompt_tokens", 0))
        return ContextExceededError(
            f"the prompt is {tokens} tokens but the loaded context holds {loaded}",
            hint="load the model with a larger n_ctx, or shorten the prompt",
            details={"prompt_tokens": tokens, "n_ctx": loaded})

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

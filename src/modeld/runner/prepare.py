"""A generate request's prompt, rendered and tokenized on a thread of its own (issue 35).

Tokenizing is not cheap: llama.cpp's SPM tokenizer took 2.3 s for 1 MB of ordinary text and
67 s for 1 MB of random letters here (it grows faster than the text). Done in the batch loop,
10 MB of ``instructions`` froze the other streams of the model for 17.8 s before the context
check refused it. So the loop hands each new prompt to this one thread (llama_tokenize holds
no lock: llama-server tokenizes on its HTTP threads too) and admits it once its tokens are
ready; the streams decode meanwhile. A long prompt's thread runs in Linux's SCHED_IDLE class, so
on a machine with no idle core the decoding keeps the CPU first (measured: a 2 MB count_tokens
beside a stream made gaps of 2.2 s at the same priority; docs/benchmarks.md). An ordinary prompt
(under :data:`QUICK_CHARS`: milliseconds of tokenizing) goes to a thread at the runner's own
priority instead: on the idle class it starved behind llama.cpp's spinning decode threads on a
2-core box and joined the batch only after the streams already running had finished.

Before any tokenizing, a prompt that cannot fit is refused from its length in bytes: no token
of the vocabulary is longer than its longest piece, so a text of B bytes is at least
B / longest tokens. That holds where llama.cpp's tokenizer writes every byte of the text into
some token and never lets one token swallow unbounded text: the SPM vocabularies (a piece
with no token of its own falls back to byte tokens, or the tokenizer fails; it never drops
text), without special tokens that strip the spaces around them (``LSTRIP``/``RSTRIP``).
BPE drops a piece whose bytes have no tokens, UGM and WPM normalise (collapse spaces, fold
characters): for those no bound is claimed and the tokenizer decides, on this thread.

The reply's grammar is parsed here too, in the prompt's lane, so a request joins the batch with
its sampler ready (``llama_sampler_init_grammar`` reads the vocabulary only through its const
tokenizer, for ``<token>`` literals, as the tokenizing above does: safe beside a decode).
The parse is quick (a 50,000-word enum's 483 KB grammar: 14 ms here) but it ran in the loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import NamedTuple

import llama_cpp

from modeld.errors import ContextExceededError, ModeldError
from modeld.runner.prompting import PromptText
from modeld.runner.sampling import Grammar
from modeld.runner.specs import GenerateSpec

log = logging.getLogger("modeld.runner")
#: How much nicer than the runner the tokenizer thread is where SCHED_IDLE is not available.
NICENESS = 5
#: Prompts of fewer characters than this (text, thinking, tool definitions) are tokenized at
#: the runner's priority: tens of milliseconds at most, and they should join the batch now.
QUICK_CHARS = 32_768
#: Prompts of this many characters or more get a lane of their own (issue 45: a 12 MB
#: count_tokens held a 36,000-character prompt behind it for 63.8 s instead of 1.1 s).
HUGE_CHARS = 1 << 20


class Prepared(NamedTuple):
    """A request ready to join the batch: its prompt's tokens and text, its grammar sampler."""

    tokens: list[int]
    prompt: PromptText
    grammar: Grammar | None = None

    def discard(self) -> None:
        """Free what the request will not use now (it was cancelled, refused or only
        counted): its grammar and its images."""
        if self.grammar is not None:
            self.grammar.close()
        if self.prompt.media is not None:
            self.prompt.media.free()


def preparing(tokens_of: Callable[[GenerateSpec], tuple[list[int], PromptText]],
              llm: llama_cpp.Llama, n_ctx_seq: int) -> Callable[[GenerateSpec], Prepared]:
    """What a lane does for one request of a batch of ``n_ctx_seq``-token sequences: its
    prompt's tokens (``tokens_of``), refused when they cannot fit, then its grammar parsed, so
    none of it runs in the batch loop (issue 35: a 483 KB grammar took 14-16 ms there)."""

    def prepare(spec: GenerateSpec) -> Prepared:
        tokens, prompt = tokens_of(spec)
        try:
            if not spec.count_only and len(tokens) >= n_ctx_seq:
                raise context_exceeded(len(tokens), n_ctx_seq)
            if spec.count_only or not spec.grammar:
                return Prepared(tokens, prompt)
            t0 = time.perf_counter()
            grammar = Grammar(llm, spec.grammar)
        except BaseException:
            Prepared(tokens, prompt).discard()  # its images, tokenized for nothing
            raise
        log.info("request %s: its grammar (%d bytes) parsed in %.1f ms on %s", spec.rid,
                 len(spec.grammar), (time.perf_counter() - t0) * 1000,
                 threading.current_thread().name)  # fmt: skip
        return Prepared(tokens, prompt, grammar)

    return prepare


def context_exceeded(prompt_tokens: int, n_ctx: int, *, at_least: bool = False) -> ModeldError:
    """``at_least``: ``prompt_tokens`` is a lower bound (the prompt was not tokenized)."""
    return ContextExceededError(
        f"the prompt is {'at least ' if at_least else ''}{prompt_tokens} tokens but the loaded "
        f"context holds {n_ctx}",
        hint="load the model with a larger n_ctx, or shorten the prompt",
        details={"prompt_tokens": prompt_tokens, "n_ctx": n_ctx,
                 **({"prompt_tokens_at_least": True} if at_least else {})},
    )


def discard(future: Future[Prepared]) -> None:
    """Drop a preparation nobody will admit: not started, it never runs; else its grammar is
    freed once it is ready (now, or on the lane when it finishes)."""
    if not future.cancel():
        future.add_done_callback(
            lambda f: f.result().discard() if not f.cancelled() and f.exception() is None
            else None)  # fmt: skip


class TokenBound:
    """The fewest tokens a text of n bytes can be for one vocabulary (0 when none is sound)."""

    def __init__(self, llm: llama_cpp.Llama) -> None:
        self.llm = llm
        self._longest: int | None = None
        self._lock = threading.Lock()

    def longest(self) -> int:
        """The longest piece of any token in bytes, or 0 when the bound does not hold for this
        vocabulary (read once: ~1 s for Gemma's 262,144 tokens, on the tokenizer thread)."""
        with self._lock:
            if self._longest is None:
                self._longest = _longest_piece(self.llm)
            return self._longest

    def at_least(self, nbytes: int) -> int:
        longest = self.longest()
        return -(-nbytes // longest) if longest else 0


def _longest_piece(llm: llama_cpp.Llama) -> int:
    vocab = llm._model.vocab
    if llama_cpp.llama_vocab_type(vocab) != llama_cpp.LLAMA_VOCAB_TYPE_SPM:
        return 0
    stripping = llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP | llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP
    size = 256
    buf = ctypes.create_string_buffer(size)
    longest = 1
    for token in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        if llama_cpp.llama_vocab_get_attr(vocab, token) & stripping:
            return 0
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, size, 0, True)
        longest = max(longest, abs(n))  # negative: the piece is longer than the buffer (-n)
    return longest


def _yield_cpu() -> None:
    """This thread runs only on CPU time the decoding leaves: SCHED_IDLE (Linux; any user may
    lower a thread's own class, and it works below nice 19 too, where a benchmark runs), else
    a few steps nicer than the runner (not Linux: the default priority)."""
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        return
    except (OSError, AttributeError):
        pass
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + NICENESS)


def prompt_chars(spec: GenerateSpec) -> int:
    """About how much text ``spec`` asks the tokenizer for (the template's own text aside)."""
    chars = len(spec.prompt or "")
    for message in spec.messages or ():
        chars += len(message.content) + len(message.thinking)
        chars += sum(len(call.name) + len(json.dumps(dict(call.arguments), default=str)) for call in
                     message.tool_calls)  # fmt: skip
    for tool in spec.tools:
        chars += len(json.dumps(tool.to_wire(), default=str))
    return chars


class _Lane:
    """One daemon thread that prepares prompts in arrival order. A daemon thread: a runner
    told to exit never waits for a tokenization."""

    def __init__(self, prepare: Callable[[GenerateSpec], Prepared], name: str,
                 idle: bool) -> None:  # fmt: skip
        self._prepare = prepare
        self._name, self._idle = name, idle
        self._queue: queue.SimpleQueue[tuple[GenerateSpec, Future[Prepared]]] = \
            queue.SimpleQueue()  # fmt: skip
        self._thread: threading.Thread | None = None

    def start(self, spec: GenerateSpec) -> Future[Prepared]:
        future: Future[Prepared] = Future()
        self._queue.put((spec, future))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        return future

    def _run(self) -> None:
        if self._idle:
            _yield_cpu()
        while True:
            spec, future = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._prepare(spec))
            except BaseException as exc:  # the request's error, answered by the loop
                future.set_exception(exc)


class Preparer:
    """Prompts to tokenize, on three lanes: ordinary ones at the runner's priority, long ones
    on CPU time the decoding leaves, and huge ones (megabytes: seconds to minutes of
    llama_tokenize, which cannot be stopped once it runs) on a lane of their own, so a long
    prompt never waits behind another caller's huge one. The loop collects the futures in any
    order; one nobody waits for any more is dropped before it starts (:func:`discard`)."""

    def __init__(self, prepare: Callable[[GenerateSpec], Prepared]) -> None:
        self._quick = _Lane(prepare, "modeld-tokenize", idle=False)
        self._long = _Lane(prepare, "modeld-tokenize-long", idle=True)
        self._huge = _Lane(prepare, "modeld-tokenize-huge", idle=True)

    def start(self, spec: GenerateSpec) -> Future[Prepared]:
        chars = prompt_chars(spec)
        lane = self._quick if chars < QUICK_CHARS else \
            self._long if chars < HUGE_CHARS else self._huge  # fmt: skip
        return lane.start(spec)

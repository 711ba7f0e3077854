"""One generate request on one sequence of a runner's context, as the batch engine keeps it
(:class:`Stream`), and what the engine needs from its runner (:class:`Host`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import llama_cpp._internals

from modeld import replyparse
from modeld.replies import ToolCallDone
from modeld.runner import specs
from modeld.runner.generation import PromptState
from modeld.runner.prompting import PromptText
from modeld.runner.promptplan import Piece
from modeld.runner.sampling import Grammar
from modeld.runner.textstream import TextStream


class Host(Protocol):
    """What the engine needs from its runner: the prompt's tokens, replies, and the socket."""

    def prompt_tokens(self, spec: specs.GenerateSpec) -> tuple[list[int], PromptText]: ...

    def apply_threads(self, n_threads: int | None) -> None: ...

    def send(self, msg: Mapping[str, Any]) -> None: ...

    def between_steps(self, active: set[str]) -> list[dict[str, Any]]: ...


@dataclass(eq=False)
class Stream:
    """One request on one sequence: its prompt still to evaluate, its sampler and its text."""

    spec: specs.GenerateSpec
    state: PromptState
    prompt: list[int]
    sampler: llama_cpp._internals.LlamaSampler
    text: TextStream
    strip_lead: bool
    t0: float
    todo: deque[Piece] = field(default_factory=deque)
    reused: int = 0
    next_token: int | None = None  # sampled, to be decoded in the next step
    completion: int = 0
    t_first: float | None = None
    unsent: str = ""
    last_send: float = 0.0
    finish: str = "length"
    context_full: bool = False  # it ended because its sequence's cells ran out
    prompt_tokens: int = 0  # the request's prompt (``prompt`` also holds a resumed reply)
    written: list[int] = field(default_factory=list)  # the reply's tokens (to resume it)
    resume_next: int | None = None  # a resumed reply's token to decode once ``prompt`` is in
    batched_max: int = 1  # the most sequences whose tokens shared a decode with this one's
    grammar: Grammar | None = None  # the reply's constraint (a format, a forced tool call)
    parser: replyparse.ReplyParser | None = None  # finds thinking and tool calls in the text
    unsent_thinking: str = ""
    unsent_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI-style deltas
    unsent_logprobs: list[dict[str, Any]] = field(default_factory=list)
    unsent_done: list[ToolCallDone] = field(default_factory=list)  # calls complete since
    calls: list[replyparse.ToolCall] = field(default_factory=list)
    preserve: frozenset[int] = frozenset()  # special tokens whose text the parser needs

    @property
    def rid(self) -> str:
        return self.spec.rid

    @property
    def seq(self) -> int:
        return self.state.seq

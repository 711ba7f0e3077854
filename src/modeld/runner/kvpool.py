"""One pool of KV cells shared by the sequences (issue 36; llama-server's ``--kv-unified``).

Loaded with ``kv_unified``, the runner's ``parallel`` sequences share one KV stream of
``n_ctx`` cells instead of ``n_ctx / parallel`` each: one long conversation may use the whole
context while short requests decode beside it. Two consequences the engine handles here:

- The pool can run out. ``llama_decode`` then returns :data:`NO_SLOT` and has written nothing
  (llama.cpp places every micro-batch of the call before computing any), so the same call can
  be made again once room is made: first the cells of sequences no request holds (a finished
  request's prompt, kept for reuse; its snapshot in the prompt cache still serves it), then a
  prompt piece waits while other sequences decode (they end and free theirs), and only then
  does the request holding the most cells of the call end, as a full context ends it: finish
  ``length`` with ``context_window``, or paused to grow (runner/resume.py) when the daemon
  allowed it. No other sequence's cells are touched.
- A sequence's attention spans the pool, the other sequences' cells masked out: its logits
  differ from a solo evaluation's in the last bits (measured: 6e-4 at most on an 8-layer
  model), so greedy replies may differ from solo ones and the runner does not claim batch
  invariance (the daemon then runs ``deterministic`` greedy requests alone). Even alone, the
  others' cached cells change where its cells go and so its sums: a ``deterministic`` request
  that starts with no other request running drops them first (the prompt cache's snapshots
  stay), so its reply is the one a fresh runner gives.

Pure policy: nothing native is imported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

#: ``llama_decode``'s "no memory slot for the batch": nothing written, the call may be repeated.
NO_SLOT = 1


class Cells(Protocol):
    """A sequence's state: what its cells hold (generation.PromptState)."""

    seq: int
    tokens: list[int]

    def reset(self) -> None: ...


class Holder(Protocol):
    """A request on a sequence (stream.Stream)."""

    @property
    def seq(self) -> int: ...

    @property
    def state(self) -> Cells: ...

    @property
    def next_token(self) -> int | None: ...


@dataclass(frozen=True)
class Room:
    """What to do about a call that found no cells: ``freed`` idle cells (repeat the call),
    ``wait`` (a prompt call: its pieces go back and wait for the next step), or ``end`` that
    request and repeat the call without it."""

    freed: int = 0
    wait: bool = False
    end: Holder | None = None


def free_idle(states: Sequence[Cells], busy: set[int]) -> int:
    """Drop the cells of every sequence outside ``busy``; how many cells that freed."""
    freed = 0
    for state in states:
        if state.seq not in busy and state.tokens:
            freed += len(state.tokens)
            state.reset()
    return freed


def make_room(
    states: Sequence[Cells], streams: Sequence[Holder], call: Sequence[Holder], *, prompt: bool
) -> Room:
    """How to make room for ``call`` (the requests of a decode that found no cells) among
    ``streams`` (every request holding a sequence). ``prompt``: the call evaluates prompt
    pieces, which may wait while another request decodes its reply."""
    freed = free_idle(states, {s.seq for s in streams})
    if freed:
        return Room(freed=freed)
    in_call = {s.seq for s in call}
    if prompt and any(s.next_token is not None for s in streams if s.seq not in in_call):
        return Room(wait=True)
    # the one holding the most cells; a tie: the highest sequence (the latest admitted, mostly)
    return Room(end=max(call, key=lambda s: (len(s.state.tokens), s.seq)))

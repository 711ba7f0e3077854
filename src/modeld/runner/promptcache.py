"""The runner's prompt-state cache: snapshots of evaluated prompts and the sequences' context
checkpoints, in one store bounded in bytes.

llama-server's ``--cache-ram`` idea, inside modeld's memory budget: after a prompt is evaluated
the runner keeps the context state (the used KV cells, from ``llama_state_get_data``) plus the
last logits row, so a later request for the same prompt samples at once and one sharing a
prefix evaluates only the rest.

A sliding-window model keeps only the last window's cells of its sliding-window layers, so its
live cells cannot be rewound further back than one window (issue 47: an agent's prompt that
branches back 5k tokens was evaluated again from 0). Its sequences therefore also keep
*checkpoints* (llama-server's ``--ctx-checkpoints``): the window cells alone
(``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``) saved every window's worth of prompt and at each
prompt's end; with the full-attention cells cut back to a checkpoint's position they give the
state of that prefix. When the store is full, least recently used snapshots go first (while
checkpoints hold no more than half of it), then the checkpoint whose removal leaves the
smallest gap, so what is left still covers the whole conversation, more coarsely.

The bound is the ``prompt_cache_mib`` setting (by default derived from the memory budget:
:func:`modeld.sizing.prompt_cache_bytes`), which the daemon reserves with the model's
estimate. Pure: the buffers are opaque here (:mod:`modeld.runner.generation` captures and
restores them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sized
from dataclasses import dataclass, field
from typing import Any

from modeld.runner.promptplan import Cached

#: Bookkeeping counted per snapshot on top of its buffers (Python objects, the token tuple).
SNAPSHOT_OVERHEAD = 256


@dataclass(eq=False)
class Snapshot:
    """One evaluated prompt: its tokens, llama.cpp state buffer and last logits row."""

    tokens: tuple[int, ...]
    state: Any  # a ctypes byte array of llama_state_get_data (kept as is: no copy)
    state_size: int
    logits: Any  # the prompt's last logits row (n_vocab float32), a ctypes array
    logits_size: int
    stable: int  # leading positions equal to a fresh aligned evaluation
    logits_stable: bool  # the logits row equals a fresh aligned evaluation's
    cut_min: int = 0  # the shortest prefix its cells can be cut to (promptplan.Cached)
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = snapshot_bytes(self.state_size, self.logits_size, len(self.tokens))

    def view(self) -> Cached:
        """What the planner needs to know about it."""
        return Cached(self.tokens, self.stable, self.logits_stable, has_logits=True,
                      cut_min=self.cut_min)


@dataclass(eq=False)
class Checkpoint:
    """Sequence ``seq``'s sliding-window cells after its first ``n`` positions."""

    seq: int
    n: int
    state: Any  # a ctypes byte array of llama_state_seq_get_data_ext(PARTIAL_ONLY)
    size: int
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = self.size + SNAPSHOT_OVERHEAD


def snapshot_bytes(state_size: int, logits_size: int, n_tokens: int) -> int:
    """What a snapshot would count against the budget (to skip one before copying it)."""
    return state_size + logits_size + 4 * n_tokens + SNAPSHOT_OVERHEAD


class SnapshotStore(Sized):
    """Snapshots, least recently used first, holding at most ``budget_bytes`` (0 disables)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self._items: OrderedDict[tuple[int, ...], Snapshot] = OrderedDict()
        self._checkpoints: dict[int, list[Checkpoint]] = {}  # by sequence, by position
        self.checkpoint_bytes = 0
        self.used_bytes = 0
        self.hits = 0
        self.stored = 0
        self.skipped = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def snapshots(self) -> list[Snapshot]:
        """The stored snapshots (least recently used first)."""
        return list(self._items.values())

    def wants(self, tokens: tuple[int, ...], nbytes: int, logits_stable: bool) -> bool:
        """Whether a snapshot of ``tokens`` costing ``nbytes`` would be kept: it must fit the
        budget, and not duplicate one already stored (unless it upgrades that one to
        reproducible logits)."""
        if not self.enabled or nbytes > self.budget_bytes:
            return False
        old = self._items.get(tokens)
        return old is None or (logits_stable and not old.logits_stable)

    def add(self, snap: Snapshot) -> bool:
        """Store ``snap`` (evicting the least recently used), or skip it (False)."""
        if not self.wants(snap.tokens, snap.nbytes, snap.logits_stable):
            self.skipped += 1
            if snap.tokens in self._items:
                self._items.move_to_end(snap.tokens)
            return False
        self.discard(snap.tokens)
        while self.used_bytes + snap.nbytes > self.budget_bytes and self._evict_one(None):
            pass
        self._items[snap.tokens] = snap
        self.used_bytes += snap.nbytes
        self.stored += 1
        return True

    def use(self, snap: Snapshot) -> None:
        """Mark ``snap`` as just used (moves it to the most recent end)."""
        if snap.tokens in self._items:
            self._items.move_to_end(snap.tokens)
            self.hits += 1

    def discard(self, tokens: tuple[int, ...]) -> None:
        old = self._items.pop(tokens, None)
        if old is not None:
            self.used_bytes -= old.nbytes

    def clear(self) -> None:
        self._items.clear()
        self._checkpoints.clear()
        self.used_bytes = self.checkpoint_bytes = 0

    # ---------------------------------------------------------------- checkpoints

    def checkpoints(self, seq: int) -> list[Checkpoint]:
        """Sequence ``seq``'s checkpoints, by position."""
        return list(self._checkpoints.get(seq, ()))

    def add_checkpoint(self, ck: Checkpoint) -> bool:
        """Keep ``ck`` (replacing one at the same position), making room as the module says;
        False when it cannot fit."""
        if not self.enabled or ck.nbytes > self.budget_bytes:
            return False
        self.drop_checkpoints(ck.seq, ck.n - 1, upto=ck.n)
        mine = self._checkpoints.setdefault(ck.seq, [])
        mine.append(ck)
        mine.sort(key=lambda c: c.n)
        self.used_bytes += ck.nbytes
        self.checkpoint_bytes += ck.nbytes
        while self.used_bytes > self.budget_bytes:
            if not self._evict_one(ck):
                self.drop_checkpoints(ck.seq, ck.n - 1, upto=ck.n)
                return False
        return True

    def drop_checkpoints(self, seq: int, after: int = -1, upto: int | None = None) -> None:
        """Forget ``seq``'s checkpoints past position ``after`` (up to ``upto``): its cells
        there are gone or hold other tokens now."""
        kept: list[Checkpoint] = []
        for ck in self._checkpoints.get(seq, ()):
            if after < ck.n and (upto is None or ck.n <= upto):
                self.used_bytes -= ck.nbytes
                self.checkpoint_bytes -= ck.nbytes
            else:
                kept.append(ck)
        if kept:
            self._checkpoints[seq] = kept
        else:
            self._checkpoints.pop(seq, None)

    def _evict_one(self, keep: Checkpoint | None) -> bool:
        """Free one item: the least recently used snapshot while checkpoints hold at most half
        the budget, else the checkpoint whose removal leaves the smallest gap (never ``keep``,
        the one being added). False: nothing to free."""
        if self._items and (self.checkpoint_bytes <= self.budget_bytes // 2
                            or not self._checkpoints):
            _, old = self._items.popitem(last=False)
            self.used_bytes -= old.nbytes
            return True
        best: tuple[int, int, int] | None = None  # (gap left, seq, position)
        for seq, cks in self._checkpoints.items():
            for i, ck in enumerate(cks):
                if ck is keep:
                    continue
                before = cks[i - 1].n if i else 0
                after = cks[i + 1].n if i + 1 < len(cks) else ck.n
                gap = after - before
                if best is None or gap < best[0]:
                    best = (gap, seq, ck.n)
        if best is None:
            if not self._items:
                return False
            _, old = self._items.popitem(last=False)
            self.used_bytes -= old.nbytes
            return True
        _, seq, n = best
        self.drop_checkpoints(seq, n - 1, upto=n)
        return True

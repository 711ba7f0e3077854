"""The runner's prompt-state cache: snapshots of evaluated prompts in an LRU store bounded in bytes.

llama-server's ``--cache-ram`` idea, inside modeld's memory budget: after a prompt is evaluated
the runner keeps the context state (the used KV cells, from ``llama_state_get_data``) plus the
last logits row, so a later request for the same prompt samples at once and one sharing a
prefix evaluates only the rest. The bound is the ``prompt_cache_mib`` setting, which the daemon
also adds to the model's memory estimate. Pure: the buffers are opaque here
(:mod:`modeld.runner.generation` captures and restores them).
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


def snapshot_bytes(state_size: int, logits_size: int, n_tokens: int) -> int:
    """What a snapshot would count against the budget (to skip one before copying it)."""
    return state_size + logits_size + 4 * n_tokens + SNAPSHOT_OVERHEAD


class SnapshotStore(Sized):
    """Snapshots, least recently used first, holding at most ``budget_bytes`` (0 disables)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self._items: OrderedDict[tuple[int, ...], Snapshot] = OrderedDict()
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
        while self._items and self.used_bytes + snap.nbytes > self.budget_bytes:
            _, old = self._items.popitem(last=False)
            self.used_bytes -= old.nbytes
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
        self.used_bytes = 0

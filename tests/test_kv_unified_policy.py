"""One pool of KV cells shared by the sequences (issue 36, ``kv_unified``): the pure parts. The
runner's policy for a full pool, the estimate and sizing of a load, the option's reading, and
how ``ps`` shows the layout (real policy code; the sequences are small stand-ins)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from modeld import sizing
from modeld.cache.policy import CachePolicy, ModelKey
from modeld.cli.pstable import ctx_cell
from modeld.config import Settings
from modeld.runner import kvpool
from modeld.settingvalues import parse_model_options
from test_memory import make_info

MiB = 1 << 20
KEY = ModelKey("/models/x.gguf", 1, 1, "generate")
BASE = 48 * MiB


@dataclass
class Cells:
    """A sequence's cells (kvpool.Cells)."""

    seq: int
    tokens: list[int] = field(default_factory=list)

    def reset(self) -> None:
        self.tokens = []


@dataclass
class Holder:
    """A request on a sequence (kvpool.Holder)."""

    state: Cells
    next_token: int | None = None

    @property
    def seq(self) -> int:
        return self.state.seq


def test_a_full_pool_frees_idle_cells_first() -> None:
    states = [Cells(0, [1] * 50), Cells(1, [1] * 300), Cells(2, [])]
    busy = Holder(states[0], next_token=5)
    room = kvpool.make_room(states, [busy], [busy], prompt=False)
    assert room == kvpool.Room(freed=300)
    assert states[1].tokens == [] and states[0].tokens == [1] * 50  # a busy one is kept


def test_a_prompt_waits_while_another_reply_decodes() -> None:
    states = [Cells(0, [1] * 400), Cells(1, [1] * 60)]
    decoding, reading = Holder(states[0], next_token=7), Holder(states[1])
    room = kvpool.make_room(states, [decoding, reading], [reading], prompt=True)
    assert room == kvpool.Room(wait=True)
    assert states[0].tokens and states[1].tokens  # nothing dropped


def test_then_the_request_holding_the_most_cells_ends() -> None:
    states = [Cells(0, [1] * 40), Cells(1, [1] * 400), Cells(2, [1] * 40)]
    holders = [Holder(s, next_token=1) for s in states]
    room = kvpool.make_room(states, holders, holders, prompt=False)
    assert room.end is holders[1] and not room.wait and not room.freed
    # a prompt alone with nothing else decoding cannot wait: it ends too
    alone = Holder(states[1])
    assert kvpool.make_room(states, [alone], [alone], prompt=True) == kvpool.Room(freed=80)
    assert kvpool.make_room(states, [alone], [alone], prompt=True).end is alone
    # a tie: the highest sequence (mostly the latest admitted)
    even = [Holder(Cells(i, [1] * 10), next_token=1) for i in range(3)]
    assert kvpool.make_room([h.state for h in even], even, even, prompt=False).end is even[2]


def test_the_estimate_of_a_shared_pool_is_that_of_its_cells() -> None:
    info = make_info()
    one = sizing.estimate_n(info, 2048, parallel=1)
    separate = sizing.estimate_n(info, 2048, parallel=4)
    shared = sizing.estimate_n(info, 2048, parallel=4, unified=True)
    assert shared.kv_cache == one.kv_cache  # 2048 cells, not 4 x 2048
    assert shared.total < separate.total and separate.kv_cache >= 4 * shared.kv_cache * 0.99
    # sliding-window layers keep a window per sequence in the pool (n_swa x 4 + ubatch)
    swa = make_info(sliding_window=256, sliding_layers=(True, True, True, False))
    s1 = sizing.estimate_n(swa, 8192, parallel=1)
    s4 = sizing.estimate_n(swa, 8192, parallel=4, unified=True)
    assert one.kv_cache < s4.kv_cache and s1.kv_cache < s4.kv_cache
    assert s4.kv_cache < sizing.estimate_n(swa, 8192, parallel=4).kv_cache


def test_a_shared_pool_keeps_its_parallel_where_separate_contexts_are_lowered() -> None:
    info = make_info()
    s = Settings(prompt_cache_mib=0, parallel=4)
    two = sizing.estimate_n(info, 2048, parallel=2).total
    tight = CachePolicy(two + BASE + MiB, 3, time.monotonic)
    separate = sizing.size_for(info, "generate", tight, KEY, BASE, None, s)
    assert (separate.parallel, separate.n_ctx, separate.kv_unified) == (2, 2048, False)
    shared = sizing.size_for(info, "generate", tight, KEY, BASE, None, s, unified=True)
    assert shared.parallel == 4 and shared.kv_unified
    assert shared.n_ctx >= 2 * 2048  # one conversation may use all of it
    assert shared.need_bytes <= tight.budget_bytes
    assert sizing.max_context(info, "generate", tight, KEY, BASE, s, 4, unified=True) >= \
        shared.n_ctx  # growth plans the pool as one stream  # fmt: skip
    one = sizing.size_for(info, "generate", tight, KEY, BASE, None,
                          Settings(prompt_cache_mib=0, parallel=1), unified=True)
    assert not one.kv_unified  # one sequence: nothing to share


def test_the_option_per_model_and_its_cell() -> None:
    opts = parse_model_options({"big": {"kv_unified": "true"}, "small": {"kv-unified": False}})
    assert opts == {"big": {"kv_unified": True}, "small": {"kv_unified": False}}
    with pytest.raises(ValueError, match="not a boolean"):
        parse_model_options({"big": {"kv_unified": "maybe"}})
    assert ctx_cell(8192, 4, True) == "8192 shared by 4"
    assert ctx_cell(2048, 4, False) == "2048x4"
    assert ctx_cell(8192, 1, True) == "8192"

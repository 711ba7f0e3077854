"""The prompt snapshot store (pure): byte budget, LRU order, duplicates, 0 disables."""

from __future__ import annotations

from modeld.runner.promptcache import (
    SNAPSHOT_OVERHEAD,
    Checkpoint,
    Snapshot,
    SnapshotStore,
    snapshot_bytes,
)


def snap(tokens: tuple[int, ...], size: int = 1000, logits_stable: bool = True) -> Snapshot:
    return Snapshot(tokens, b"s" * size, size, b"l" * 400, 400, 0, logits_stable)


def test_size_counts_state_logits_tokens_and_overhead() -> None:
    s = snap((1, 2, 3), 1000)
    assert s.nbytes == 1000 + 400 + 12 + SNAPSHOT_OVERHEAD == snapshot_bytes(1000, 400, 3)


def test_store_stays_within_its_budget_evicting_least_recently_used() -> None:
    one = snap((1,)).nbytes
    store = SnapshotStore(3 * one)
    for i in range(1, 4):
        assert store.add(snap((i,)))
    store.use(store.snapshots()[0])  # (1,) becomes the most recent
    assert store.add(snap((4,)))
    assert [s.tokens for s in store.snapshots()] == [(3,), (1,), (4,)]
    assert store.used_bytes == 3 * one <= store.budget_bytes
    assert store.hits == 1


def test_a_snapshot_larger_than_the_budget_is_skipped() -> None:
    store = SnapshotStore(2000)
    assert store.add(snap((1,), 500))
    assert not store.add(snap((2,), 5000))
    assert len(store) == 1 and store.skipped == 1


def test_zero_budget_disables_the_store() -> None:
    store = SnapshotStore(0)
    assert not store.enabled
    assert not store.wants((1,), 1, True)
    assert not store.add(snap((1,), 1))
    assert len(store) == 0


def test_duplicates_are_skipped_unless_they_bring_stable_logits() -> None:
    store = SnapshotStore(1 << 20)
    assert store.add(snap((1, 2), logits_stable=False))
    assert not store.add(snap((1, 2), logits_stable=False))
    assert store.add(snap((1, 2), logits_stable=True))  # replaces the unstable one
    assert not store.add(snap((1, 2), logits_stable=False))
    assert len(store) == 1 and store.snapshots()[0].logits_stable
    assert store.used_bytes == store.snapshots()[0].nbytes


def test_discard_and_clear_release_bytes() -> None:
    store = SnapshotStore(1 << 20)
    store.add(snap((1,)))
    store.add(snap((2,)))
    store.discard((1,))
    assert [s.tokens for s in store.snapshots()] == [(2,)]
    store.clear()
    assert len(store) == 0 and store.used_bytes == 0


def ck(n: int, seq: int = 0, size: int = 1000) -> Checkpoint:
    return Checkpoint(seq, n, b"c" * size, size)


def test_checkpoints_are_kept_by_position_and_cut_with_their_sequence() -> None:
    store = SnapshotStore(1 << 20)
    for n in (512, 1024, 1536):
        assert store.add_checkpoint(ck(n))
    assert store.add_checkpoint(ck(512, seq=1))
    assert store.add_checkpoint(ck(1024))  # the same position again replaces it
    assert [c.n for c in store.checkpoints(0)] == [512, 1024, 1536]
    assert store.used_bytes == store.checkpoint_bytes == 4 * ck(0).nbytes
    store.drop_checkpoints(0, 1024)  # the sequence was cut to 1024 tokens
    assert [c.n for c in store.checkpoints(0)] == [512, 1024]
    store.drop_checkpoints(1)  # reset
    assert store.checkpoints(1) == [] and store.used_bytes == 2 * ck(0).nbytes
    store.clear()
    assert store.checkpoints(0) == [] and store.used_bytes == store.checkpoint_bytes == 0


def test_a_full_store_thins_checkpoints_where_they_are_densest_and_snapshots_go_first() -> None:
    one = ck(0).nbytes
    store = SnapshotStore(4 * one)
    for n in (512, 1024, 1536, 2048):
        assert store.add_checkpoint(ck(n))
    assert store.add_checkpoint(ck(2200))  # without 2048 the gap is smallest (1536..2200)
    assert [c.n for c in store.checkpoints(0)] == [512, 1024, 1536, 2200]
    assert store.used_bytes <= store.budget_bytes
    # a snapshot while checkpoints hold more than half: checkpoints are thinned for it
    big = snap((9,), one)
    assert store.add(big) and len(store) == 1
    assert store.used_bytes <= store.budget_bytes
    # a checkpoint while checkpoints hold at most half: the least recently used snapshot goes
    small = SnapshotStore(4 * one + 1000)
    small.add(snap((1,), one))
    small.add(snap((2,), one))
    for n in (512, 1024):
        assert small.add_checkpoint(ck(n))
    assert [s.tokens for s in small.snapshots()] == [(2,)]
    assert [c.n for c in small.checkpoints(0)] == [512, 1024]
    assert not SnapshotStore(10).add_checkpoint(ck(1))  # larger than the whole budget

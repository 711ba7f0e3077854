"""modeld.runner.promptfile: evicted models' prompt snapshots on disk (pure: bytes buffers)."""

from __future__ import annotations

import os
from pathlib import Path

from modeld.runner import promptfile
from modeld.runner.promptcache import Snapshot

ID = {"path": "/m.gguf", "size": 10, "mtime_ns": 1, "n_ctx": 512}


def _snap(tokens: tuple[int, ...], fill: int) -> Snapshot:
    return Snapshot(tokens, bytearray([fill]) * 40, 40, bytearray([fill + 1]) * 16, 16,
                    stable=len(tokens), logits_stable=True, cut_min=len(tokens) - 1)


def _load(directory: Path, identity: dict[str, object]) -> list[Snapshot]:
    return promptfile.load(directory, identity, bytearray, bytearray)


def test_round_trip_keeps_order_tokens_and_buffers(tmp_path: Path) -> None:
    snaps = [_snap((1, 2, 3), 7), _snap((1, 5), 9)]
    assert promptfile.save(tmp_path, ID, snaps, 1 << 20) > 112
    back = _load(tmp_path, ID)
    assert [s.tokens for s in back] == [(1, 2, 3), (1, 5)]
    assert bytes(back[1].state) == bytes([9]) * 40 and bytes(back[1].logits) == bytes([10]) * 16
    assert back[0].stable == 3 and back[0].logits_stable and back[0].nbytes == snaps[0].nbytes
    assert [s.cut_min for s in back] == [2, 1]


def test_files_are_private_to_the_user(tmp_path: Path) -> None:
    promptfile.save(tmp_path / "prompts", ID, [_snap((1,), 3)], 1 << 20)
    assert (tmp_path / "prompts").stat().st_mode & 0o777 == 0o700
    assert promptfile.file_for(tmp_path / "prompts", ID).stat().st_mode & 0o777 == 0o600


def test_other_identity_damage_and_absence_give_nothing(tmp_path: Path) -> None:
    assert _load(tmp_path, ID) == []
    promptfile.save(tmp_path, ID, [_snap((1,), 3)], 1 << 20)
    assert _load(tmp_path, {**ID, "mtime_ns": 2}) == []  # the file on disk changed
    path = promptfile.file_for(tmp_path, ID)
    path.write_bytes(path.read_bytes()[:-5])  # truncated
    assert _load(tmp_path, ID) == [] and not path.exists()  # ignored and removed


def test_touch_marks_an_existing_file_only(tmp_path: Path) -> None:
    assert not promptfile.touch(tmp_path, ID)
    promptfile.save(tmp_path, ID, [_snap((1,), 3)], 1 << 20)
    path = promptfile.file_for(tmp_path, ID)
    os.utime(path, (1, 1))
    assert promptfile.touch(tmp_path, ID) and path.stat().st_mtime > 1


def test_saving_nothing_removes_the_file(tmp_path: Path) -> None:
    promptfile.save(tmp_path, ID, [_snap((1,), 3)], 1 << 20)
    assert promptfile.save(tmp_path, ID, [], 1 << 20) == 0
    assert list(tmp_path.iterdir()) == []


def test_directory_is_bounded_oldest_first(tmp_path: Path) -> None:
    for i in range(5):
        ident = {**ID, "path": f"/m{i}.gguf"}
        promptfile.save(tmp_path, ident, [_snap((i,), i)], 1 << 20)
        os.utime(promptfile.file_for(tmp_path, ident), (i, i))
    size = promptfile.file_for(tmp_path, {**ID, "path": "/m4.gguf"}).stat().st_size
    promptfile.prune(tmp_path, 2 * size)
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {promptfile.file_for(tmp_path, {**ID, "path": f"/m{i}.gguf"}).name
                    for i in (3, 4)}

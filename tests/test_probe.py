"""Tests of modeld.model.probe: cgroup parsing on fake trees, and real measurements of a
child process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fakenvml import FakeCard, FakeNvml
from modeld.model import probe

MiB = 1 << 20
GiB = 1 << 30


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def v2(tmp_path: Path) -> Path:
    """A cgroup v2 tree: /a has a 1 GiB limit, /a/b (ours) none, 100 MiB of it is page cache."""
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpu memory\n")
    write(root / "a" / "memory.max", f"{GiB}\n")
    write(root / "a" / "memory.current", f"{300 * MiB}\n")
    write(root / "a" / "memory.stat", f"anon 1\ninactive_file {100 * MiB}\nactive_file 5\n")
    write(root / "a" / "b" / "memory.max", "max\n")
    write(root / "a" / "b" / "memory.current", f"{250 * MiB}\n")
    return root


# --- memory limits ------------------------------------------------------------------------


def test_v2_limit_is_found_on_an_ancestor(v2: Path) -> None:
    assert probe.cgroup_memory(v2, "/a/b") == (GiB, 200 * MiB, 2)


def test_v2_tightest_headroom_wins(v2: Path) -> None:
    write(v2 / "a" / "b" / "memory.max", f"{512 * MiB}\n")  # 512 - 250 < 1024 - 200
    assert probe.cgroup_memory(v2, "/a/b") == (512 * MiB, 250 * MiB, 2)


def test_v2_unlimited(tmp_path: Path) -> None:
    write(tmp_path / "cgroup.controllers", "memory\n")
    write(tmp_path / "memory.max", "max\n")
    assert probe.cgroup_memory(tmp_path, "/") == (None, None, None)


def test_v2_garbage_is_ignored(tmp_path: Path) -> None:
    write(tmp_path / "cgroup.controllers", "memory\n")
    write(tmp_path / "x" / "memory.max", "lots\n")
    assert probe.cgroup_memory(tmp_path, "/x") == (None, None, None)


@pytest.mark.parametrize(
    ("limit", "expected"),
    [(2 * GiB, (2 * GiB, 700 * MiB, 1)), (9223372036854771712, (None, None, None))],
)
def test_v1(tmp_path: Path, limit: int, expected: tuple[int | None, ...]) -> None:
    write(tmp_path / "memory" / "memory.limit_in_bytes", f"{limit}\n")
    write(tmp_path / "memory" / "memory.usage_in_bytes", f"{GiB}\n")
    write(tmp_path / "memory" / "memory.stat", f"cache 1\ntotal_inactive_file {324 * MiB}\n")
    assert probe.cgroup_memory(tmp_path) == expected


def test_no_cgroup_files(tmp_path: Path) -> None:
    assert probe.cgroup_memory(tmp_path) == (None, None, None)
    assert probe.cgroup_cpu_quota(tmp_path) is None


def test_usable_memory_is_capped_by_the_cgroup(v2: Path) -> None:
    budget = probe.usable_memory(cgroup_root=v2, cgroup="/a/b", gpus=False)
    assert budget.cgroup_limit == GiB and budget.cgroup_version == 2
    assert budget.ram_available <= GiB - 200 * MiB
    assert budget.ram_available == min(budget.system_available, GiB - 200 * MiB)
    assert budget.ram_total <= GiB
    assert budget.ram_bytes == budget.ram_available
    assert budget.to_dict()["cgroup_limit"] == GiB


def test_usable_memory_without_limits_is_psutil(tmp_path: Path) -> None:
    budget = probe.usable_memory(cgroup_root=tmp_path, gpus=False)
    assert budget.cgroup_limit is None
    assert budget.ram_available == budget.system_available > 0
    assert budget.ram_total >= budget.ram_available


def test_real_machine_probe_never_fails() -> None:
    budget = probe.usable_memory()  # real cgroup files, real NVML attempt (absent here is fine)
    assert budget.ram_available > 0
    assert budget.vram_free <= budget.vram_total
    assert all(g.total >= g.free for g in budget.gpus)


def test_own_cgroup(tmp_path: Path) -> None:
    write(tmp_path / "self" / "cgroup", "12:memory:/old\n0::/user.slice/app.scope\n")
    assert probe.own_cgroup(tmp_path) == "/user.slice/app.scope"
    write(tmp_path / "self" / "cgroup", "4:memory:/v1-only\n")
    assert probe.own_cgroup(tmp_path) == "/"


# --- CPU ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu_max", "quota"),
    [("150000 100000", 1.5), ("max 100000", None), ("50000 100000", 0.5), ("junk", None)],
)
def test_v2_cpu_quota(tmp_path: Path, cpu_max: str, quota: float | None) -> None:
    write(tmp_path / "cgroup.controllers", "cpu\n")
    write(tmp_path / "svc" / "cpu.max", cpu_max + "\n")
    assert probe.cgroup_cpu_quota(tmp_path, "/svc") == quota


@pytest.mark.parametrize(("quota_us", "expected"), [("-1", None), ("250000", 2.5)])
def test_v1_cpu_quota(tmp_path: Path, quota_us: str, expected: float | None) -> None:
    write(tmp_path / "cpu" / "cpu.cfs_quota_us", quota_us + "\n")
    write(tmp_path / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert probe.cgroup_cpu_quota(tmp_path) == expected


def test_cpu_threads_respects_quota_and_affinity(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert probe.cpu_threads(tmp_path) == affinity
    write(tmp_path / "cgroup.controllers", "cpu\n")
    write(tmp_path / "cpu.max", "50000 100000\n")
    assert probe.cpu_threads(tmp_path, "/") == 1  # half a CPU still runs one thread
    write(tmp_path / "cpu.max", f"{100000 * (affinity + 8)} 100000\n")
    assert probe.cpu_threads(tmp_path, "/") == affinity


@pytest.mark.parametrize(
    ("machine", "flags", "expected"),
    [
        ("x86_64", "fpu sse2 avx avx2 fma", True),
        ("x86_64", "fpu sse2 avx", False),
        ("aarch64", None, True),
        ("riscv64", None, False),
        ("x86_64", None, True),  # unreadable cpuinfo: assume the larger estimate
    ],
)
def test_cpu_supports_repack(
    tmp_path: Path, machine: str, flags: str | None, expected: bool
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    if flags is not None:
        write(cpuinfo, f"processor\t: 0\nflags\t\t: {flags}\n")
    assert probe.cpu_supports_repack(cpuinfo, machine) is expected


def test_this_machine_repacks() -> None:
    # this machine class logs "CPU_REPACK model buffer size" when loading Q4_K models
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists() or " avx2" not in cpuinfo.read_text():
        pytest.skip("not an AVX2 x86-64 Linux machine")
    assert probe.cpu_supports_repack() is True


# --- per-process measurement --------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import mmap, sys
    print("ready", flush=True); sys.stdin.readline()
    anon = b"x" * (64 << 20)                     # 64 MiB of written anonymous memory
    f = open(sys.argv[1], "rb")
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    touched = sum(m[i] for i in range(0, len(m), 4096))  # fault in 32 MiB of file pages
    print("ready", flush=True); sys.stdin.readline()
    """
)


def test_measures_a_real_child(tmp_path: Path) -> None:
    data = tmp_path / "blob.bin"
    data.write_bytes(os.urandom(32 * MiB))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(data)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "ready"
        before = probe.measure_process(child.pid)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "ready"
        after = probe.measure_process(child.pid)
    finally:
        child.kill()
        child.wait()
    assert before.pid == child.pid and before.source == "smaps_rollup"
    assert after.rss == after.anon + after.file
    assert 62 * MiB <= after.anon - before.anon <= 70 * MiB
    assert 31 * MiB <= after.file - before.file <= 34 * MiB
    assert after.gpu in (None, 0)  # no GPU process memory on a CPU-only run


def test_missing_process_raises() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(ProcessLookupError):
        probe.measure_process(gone.pid, gpu=False)


def test_parses_a_fake_smaps_rollup(tmp_path: Path) -> None:
    write(
        tmp_path / "42" / "smaps_rollup",
        "00400000-7ffd [rollup]\nRss:              1000 kB\nPss:   900 kB\n"
        "Anonymous:         300 kB\nSwap:               8 kB\n",
    )
    m = probe.measure_process(42, proc_root=tmp_path, gpu=False)
    assert (m.rss, m.anon, m.file, m.swap) == (1000 * 1024, 300 * 1024, 700 * 1024, 8 * 1024)
    assert m.to_dict()["rss"] == 1000 * 1024


def test_gpu_probe_without_nvidia_is_empty_not_an_error() -> None:
    gpus = probe.gpu_memory()
    assert isinstance(gpus, tuple)
    assert probe.gpu_process_memory(os.getpid()) in (None, 0)


def test_own_memory_fast_path_agrees_with_smaps_rollup() -> None:
    """Per-request measurements read /proc/self/statm; load/unload ones read smaps_rollup."""
    block = bytearray(64 << 20)  # touched: 64 MiB of anonymous memory both must see
    fast, full = probe.own_memory(), probe.own_memory(gpu=True)
    assert abs(fast["rss"] - full["rss"]) < 8 << 20, (fast, full)
    assert fast["anon"] >= 64 << 20 and full["anon"] >= 64 << 20
    assert fast["rss"] == fast["anon"] + fast["file"]
    del block



def test_gpu_probe_reads_each_card_and_its_processes_from_nvml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # card 0 holds a runner (pid 4242) and another process, card 1 a process NVML cannot see
    fake = FakeNvml([FakeCard("NVIDIA H100", 80 * GiB, {4242: 6 * GiB, 999: 24 * GiB}),
                     FakeCard("NVIDIA L4", 24 * GiB, None, used=2 * GiB)])  # fmt: skip
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    h100, l4 = probe.gpu_memory()
    assert (h100.name, h100.total, h100.used, h100.free) == ("NVIDIA H100", 80 * GiB, 30 * GiB,
                                                             50 * GiB)  # fmt: skip
    assert h100.processes == ((999, 24 * GiB), (4242, 6 * GiB))
    assert l4.processes is None and l4.to_dict()["free"] == 22 * GiB  # none named: unknown
    assert probe.gpu_process_memory_per_card(4242) == (6 * GiB, 0)
    assert probe.gpu_process_memory(4242) == 6 * GiB
    assert fake.inits == fake.shutdowns == 3  # every probe closes NVML again
    # the budgets the daemon plans with: others' bytes out, modeld's own runner's kept
    from modeld.model import placement

    cards = [placement.Card(g.index, g.name, g.total, g.used,
                            None if g.processes is None else dict(g.processes))
             for g in (h100, l4)]  # fmt: skip
    assert placement.vram_budget(cards[0], {4242}, 0, margin=0) == 56 * GiB
    assert placement.vram_budget(cards[1], {4242}, 0, margin=0) == 22 * GiB

"""What the machine can give: usable RAM and VRAM, CPU threads, and one process's real footprint.

Why not just psutil: inside containers and CI jobs psutil reports the *host's* memory and CPUs,
while the kernel enforces the cgroup's ``memory.max`` and ``cpu.max``; exceeding the former
gets the daemon OOM-killed. So RAM is capped by the cgroup headroom and threads by the quota.
NVML is optional: no library, no driver or no GPU simply means "CPU only", never an error.

psutil and pynvml are imported inside the functions so importing this module stays cheap.
Every filesystem root is a parameter, so tests run against fake cgroup and proc trees.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_ROOT = Path("/proc")
#: cgroup v1 reports "no limit" as a huge page-aligned number (LONG_MAX rounded down)
_V1_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class GpuMemory:
    """One NVIDIA GPU as NVML reports it."""

    index: int
    name: str
    total: int
    free: int
    used: int
    #: (pid, bytes) of each process NVML names on the card; None when it names none (a
    #: container's NVML often cannot see other processes' pids)
    processes: tuple[tuple[int, int], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "total": self.total, "free": self.free,
                "used": self.used}  # fmt: skip


@dataclass(frozen=True)
class MemoryBudget:
    """Memory this process may use now, from the system and the cgroup that contains it."""

    ram_total: int  # physical RAM, or the cgroup limit when that is smaller
    ram_available: int  # min(psutil available, cgroup headroom)
    system_available: int  # what psutil alone says
    cgroup_limit: int | None = None
    cgroup_usage: int | None = None  # without reclaimable page cache
    cgroup_version: int | None = None
    gpus: tuple[GpuMemory, ...] = field(default=())

    @property
    def ram_bytes(self) -> int:
        """Alias of :attr:`ram_available` (the name the daemon uses)."""
        return self.ram_available

    @property
    def vram_free(self) -> int:
        return sum(g.free for g in self.gpus)

    @property
    def vram_total(self) -> int:
        return sum(g.total for g in self.gpus)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ram_total": self.ram_total,
            "ram_available": self.ram_available,
            "system_available": self.system_available,
            "cgroup_limit": self.cgroup_limit,
            "cgroup_usage": self.cgroup_usage,
            "cgroup_version": self.cgroup_version,
            "gpus": [g.to_dict() for g in self.gpus],
        }


@dataclass(frozen=True)
class ProcessMemory:
    """Resident memory of one process: file-backed (mmap'd weights, code) and anonymous."""

    pid: int
    rss: int
    anon: int
    file: int  # rss - anon
    swap: int = 0
    gpu: int | None = None  # NVML per-process bytes; None when unknown
    source: str = "smaps_rollup"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ----------------------------------------------------------------------------- cgroups


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _stat_value(path: Path, key: str) -> int:
    text = _read(path) or ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


def own_cgroup(proc_root: Path = PROC_ROOT) -> str:
    """This process's cgroup v2 path (``0::/path`` in /proc/self/cgroup); "/" when unknown."""
    text = _read(proc_root / "self" / "cgroup") or ""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return "/"


def _v2_dirs(root: Path, cgroup: str) -> list[Path]:
    """The process's cgroup directory and its ancestors up to ``root`` (limits nest)."""
    here = root / cgroup.strip("/") if cgroup.strip("/") else root
    dirs = []
    while True:
        dirs.append(here)
        if here == root or root not in here.parents:
            break
        here = here.parent
    return dirs


def cgroup_memory(
    root: Path = CGROUP_ROOT, cgroup: str | None = None
) -> tuple[int | None, int | None, int | None]:
    """(limit, usage without reclaimable cache, cgroup version); (None, None, None) if unlimited.

    cgroup v2: the tightest ``memory.max`` along the path, with ``memory.current`` minus
    ``inactive_file`` of the same directory. cgroup v1: ``memory/memory.limit_in_bytes``.
    """
    if (root / "cgroup.controllers").exists():
        best: tuple[int, int] | None = None
        for d in _v2_dirs(root, own_cgroup() if cgroup is None else cgroup):
            raw = _read(d / "memory.max")
            if raw is None or raw == "max" or not raw.isdigit():
                continue
            limit = int(raw)
            current = _read_int(d / "memory.current") or 0
            used = max(0, current - _stat_value(d / "memory.stat", "inactive_file"))
            if best is None or limit - used < best[0] - best[1]:
                best = (limit, used)
        if best is not None:
            return best[0], best[1], 2
    v1 = root / "memory"
    v1_limit = _read_int(v1 / "memory.limit_in_bytes")
    if v1_limit is not None and v1_limit < _V1_UNLIMITED:
        current = _read_int(v1 / "memory.usage_in_bytes") or 0
        used = max(0, current - _stat_value(v1 / "memory.stat", "total_inactive_file"))
        return v1_limit, used, 1
    return None, None, None


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, cgroup: str | None = None) -> float | None:
    """CPUs allowed by the cgroup quota (``cpu.max`` / v1 ``cfs_quota_us``); None if unlimited."""
    quotas: list[float] = []
    if (root / "cgroup.controllers").exists():
        for d in _v2_dirs(root, own_cgroup() if cgroup is None else cgroup):
            parts = (_read(d / "cpu.max") or "").split()
            if len(parts) == 2 and parts[0] != "max":
                try:
                    quota, period = int(parts[0]), int(parts[1])
                except ValueError:
                    continue
                if quota > 0 and period > 0:
                    quotas.append(quota / period)
    else:
        v1_quota = _read_int(root / "cpu" / "cpu.cfs_quota_us")
        v1_period = _read_int(root / "cpu" / "cpu.cfs_period_us")
        if v1_quota is not None and v1_period and v1_quota > 0:
            quotas.append(v1_quota / v1_period)
    return min(quotas) if quotas else None


def cpu_threads(root: Path = CGROUP_ROOT, cgroup: str | None = None) -> int:
    """Threads worth running: CPUs in our affinity mask, capped by the cgroup CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(root, cgroup)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def cpu_supports_repack(cpuinfo: Path = PROC_ROOT / "cpuinfo", machine: str | None = None) -> bool:
    """Whether ggml's CPU backend will repack quantized weights here (x86 AVX2, or ARM NEON).

    Feeds ``memory.estimate(repack=...)``: repacked matrices cost a second, anonymous copy.
    Unknown (unreadable cpuinfo on x86) counts as True, the larger and safer estimate.
    """
    import platform

    arch = (machine or platform.machine()).lower()
    if arch in ("aarch64", "arm64"):
        return True
    if arch not in ("x86_64", "amd64", "i386", "i686"):
        return False
    text = _read(cpuinfo)
    if text is None:
        return True
    for line in text.splitlines():
        if line.startswith("flags"):
            return "avx2" in line.split(":", 1)[-1].split()
    return True


# ----------------------------------------------------------------------------- GPUs


def _nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no GPU: CPU only
        return None
    return pynvml


def gpu_memory() -> tuple[GpuMemory, ...]:
    """Every NVIDIA GPU's memory and its processes' bytes; empty when NVML is unavailable."""
    nvml = _nvml()
    if nvml is None:
        return ()
    gpus = []
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            name = nvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            gpus.append(GpuMemory(i, name, int(mem.total), int(mem.free), int(mem.used),
                                  _processes(nvml, h)))  # fmt: skip
    except Exception:
        return tuple(gpus)
    finally:
        _shutdown(nvml)
    return tuple(gpus)


def _processes(nvml: Any, handle: Any) -> tuple[tuple[int, int], ...] | None:
    """(pid, bytes) of the compute and graphics processes on a card (a pid in both: summed);
    None when NVML lists none or cannot say (no per-process accounting, a container)."""
    found: dict[int, int] = {}
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            procs = getattr(nvml, fn)(handle)
        except Exception:
            continue
        for p in procs:
            pid, used = getattr(p, "pid", None), getattr(p, "usedGpuMemory", None)
            if isinstance(pid, int) and isinstance(used, int):
                found[pid] = found.get(pid, 0) + used
    return tuple(sorted(found.items())) if found else None


def gpu_process_memory(pid: int) -> int | None:
    """GPU bytes NVML attributes to ``pid`` over all devices; None without NVML."""
    per_card = gpu_process_memory_per_card(pid)
    return None if per_card is None else sum(per_card)


def gpu_process_memory_per_card(pid: int) -> tuple[int, ...] | None:
    """GPU bytes NVML attributes to ``pid`` on each device; None without NVML or a card."""
    gpus = gpu_memory()
    return tuple(dict(g.processes or ()).get(pid, 0) for g in gpus) if gpus else None


def _shutdown(nvml: Any) -> None:
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()


# ----------------------------------------------------------------------------- RAM


def _psutil() -> Any:
    """psutil, imported on first use (no stubs needed: the module is typed as Any here)."""
    import psutil  # type: ignore[import-untyped,unused-ignore]

    return psutil


def usable_memory(
    *, cgroup_root: Path = CGROUP_ROOT, cgroup: str | None = None, gpus: bool = True
) -> MemoryBudget:
    """RAM we may use now (psutil available, capped by the cgroup headroom) and GPU memory.

    Note that psutil counts clean mmap'd weight pages as available; the daemon therefore
    budgets from its own accounting and takes the minimum with this figure.
    """
    vm = _psutil().virtual_memory()
    total, available = int(vm.total), int(vm.available)
    limit, usage, version = cgroup_memory(cgroup_root, cgroup)
    ram_available = available
    if limit is not None:
        total = min(total, limit)
        ram_available = max(0, min(available, limit - (usage or 0)))
    return MemoryBudget(
        ram_total=total,
        ram_available=ram_available,
        system_available=available,
        cgroup_limit=limit,
        cgroup_usage=usage,
        cgroup_version=version,
        gpus=gpu_memory() if gpus else (),
    )


def _parse_rollup(text: str) -> dict[str, int]:
    fields: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "kB" and parts[1].isdigit():
            fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return fields


def measure_process(pid: int, *, proc_root: Path = PROC_ROOT, gpu: bool = True) -> ProcessMemory:
    """Resident memory of ``pid``: Rss and Anonymous from ``smaps_rollup`` (Linux >= 4.14).

    Falls back to psutil (rss, with ``shared`` as the file-backed part where it exists) on other
    systems. Raises ProcessLookupError when the process does not exist.
    """
    gpu_bytes = gpu_process_memory(pid) if gpu else None
    text = _read(proc_root / str(pid) / "smaps_rollup")
    if text:
        f = _parse_rollup(text)
        if "Rss" in f:
            rss, anon = f["Rss"], f.get("Anonymous", 0)
            return ProcessMemory(pid, rss, anon, max(0, rss - anon), f.get("Swap", 0), gpu_bytes)
    if sys.platform.startswith("linux") and not (proc_root / str(pid)).exists():
        raise ProcessLookupError(pid)
    psutil = _psutil()
    try:
        info = psutil.Process(pid).memory_info()
    except psutil.NoSuchProcess:
        raise ProcessLookupError(pid) from None
    rss = int(info.rss)
    shared = int(getattr(info, "shared", 0))
    return ProcessMemory(pid, rss, rss - shared, shared, 0, gpu_bytes, "psutil")


def own_memory(gpu: bool = False) -> dict[str, int]:
    """This process's resident memory in bytes: rss, anon (anonymous) and file (file-backed),
    plus gpu (NVML per-process bytes) when asked for and known."""
    if not gpu:
        fast = _statm()
        if fast is not None:
            return fast
    m = measure_process(os.getpid(), gpu=gpu)
    out = {"rss": m.rss, "anon": m.anon, "file": m.file}
    if m.gpu is not None:
        out["gpu"] = m.gpu
    return out


def malloc_trim() -> None:
    """Return freed heap pages to the OS (glibc keeps KV/compute buffers' pages otherwise:
    measured 35-65 MiB above the baseline after close(), 7 MiB after a trim)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


#: glibc's mallopt parameter for the size from which an allocation gets a mapping of its own.
M_MMAP_THRESHOLD = -3
#: That size for the daemon: its big allocations are request bodies and grammars.
MMAP_THRESHOLD = 256 * 1024


def map_big_allocations() -> None:
    """Give every allocation of :data:`MMAP_THRESHOLD` bytes or more a mapping of its own, so
    freeing it returns it to the OS. glibc does so from 128 KiB only until the first such
    block is freed, then raises the threshold to that block's size (up to 32 MiB): a 10 MB
    request body's copies then came from the heaps of the threads that made them, and the
    daemon kept 29 MiB after one (issue 35; with a fixed threshold, nothing). Setting it
    turns that adjustment off. For the daemon only (called after its fork server is forked):
    a runner allocates large blocks every step."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def _statm() -> dict[str, int] | None:
    """rss/anon/file from ``/proc/self/statm``: microseconds, where ``smaps_rollup`` takes
    3-5 ms for a process mapping a model (bench: 14% of a warm 4-token request). ``file`` is
    the kernel's shared count (file-backed plus shared memory), ``anon`` the rest."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        page = os.sysconf("SC_PAGE_SIZE")
        rss, shared = int(fields[1]) * page, int(fields[2]) * page
    except (OSError, ValueError, IndexError):
        return None
    return {"rss": rss, "anon": max(0, rss - shared), "file": shared}

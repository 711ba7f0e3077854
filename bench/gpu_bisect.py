"""Which of the runner's steps before its first load breaks llama.cpp on a GPU build (issue 34).

On an H100 every runner of a CUDA build died with SIGSEGV inside ``llama_model_load_from_file``
while the same ``Llama(...)`` call worked in a plain Python process. This script loads a model
in child processes that each take some of the runner's steps first, in the runner's order,
and says which steps a crash needs. Each child runs with Python's faulthandler and, where a C
compiler exists, a preloaded signal handler that prints the native stack (library + symbol):

  zmq_first  import zmq before llama_cpp (runner/__main__.py)
  sigint     ignore SIGINT
  logcb      llama.cpp's log through Python (install_llama_logging: a ctypes callback)
  early      initialise llama.cpp's backends and list devices first (runner: init_native)
  early_ctx  ... and ask each device its memory (CUDA: creates the context before any thread)
  zmq        a ZeroMQ context and DEALER connected to the parent (libzmq's I/O thread)
  heartbeat  the heartbeat thread with its own socket
  nvml       probe.own_memory(gpu=True): NVML before CUDA is used
  hello      the hello: llama_supports_rpc() (initialises every backend), sent to the parent
  capture    llama.cpp's lines written to a load log as they come
  llamaopen  the runner's open_llama (default-params patches) instead of a plain Llama()
and, not runner steps, to tell theories apart (issue 44; ``--only`` runs a subset):
  stdcxx     libstdc++.so.6 loaded RTLD_GLOBAL before llama_cpp (MODELD_RUNNER_PRELOAD's way)
  zmq_after  the ZeroMQ context and DEALER made after the load, before the first decode

    python bench/gpu_bisect.py MODEL OUT.jsonl [GPU_LAYERS] [--only NAME,NAME]   (-1: all layers)

One JSON line per configuration: steps, exit code, signal, the last lines; then a verdict.
On a CPU build every configuration loads (a check of the script itself).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

STEPS = ("zmq_first", "sigint", "logcb", "early", "zmq", "heartbeat", "nvml", "hello",
         "capture", "llamaopen")  # fmt: skip
OLD_RUNNER = tuple(s for s in STEPS if s != "early")  # what crashed on the H100
EXTRA = ("early_ctx",)  # not a runner step (yet): tried on top of the runner
#: Configurations that tell the theories of issue 44 apart (see the module's docstring).
THEORY = (("plain+stdcxx+zmq", ("stdcxx", "zmq")), ("plain+zmq_after", ("zmq_after",)))

_SEGV_C = r"""
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static void on_fatal(int sig, siginfo_t *si, void *uc) {
    void *frames[64];
    char head[160];
    int n = backtrace(frames, 64);
    int len = snprintf(head, sizeof head, "native-backtrace: signal %d, address %p, thread %d\n",
                       sig, si->si_addr, (int)gettid());
    write(2, head, len);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}
__attribute__((constructor)) static void install(void) {
    void *warm[1];
    struct sigaction sa;
    backtrace(warm, 1); /* load the unwinder now, not inside the handler */
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO;
    int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, 0);
}
"""


def native_handler(folder: Path) -> Path | None:
    """A shared library that prints the native stack on a fatal signal (None: no compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src, lib = folder / "segv.c", folder / "libsegv.so"
    src.write_text(_SEGV_C)
    done = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)],
                          capture_output=True, text=True)  # fmt: skip
    return lib if done.returncode == 0 else None


def child(steps: set[str], endpoint: str, model: str, gpu_layers: int, load_log: str) -> None:
    """Take ``steps`` in the runner's order, then load ``model`` and decode a few tokens."""
    import contextlib

    if "zmq_first" in steps:
        import zmq  # noqa: F401
    if "stdcxx" in steps:
        from modeld.runner import preload

        preload.preload({preload.ENV: "libstdc++.so.6"})
    import llama_cpp

    from modeld.model import probe
    from modeld.rpc import ggml as ggmlrpc
    from modeld.runner import llamalog, llamaopen, specs, transport
    from modeld.runner.main import init_native
    from modeld.wire import runnerwire

    if "sigint" in steps:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if "logcb" in steps:
        llamalog.install_llama_logging()
    devices = init_native() if "early" in steps else []
    if "early_ctx" in steps:
        devices = ggmlrpc.devices(memory=True)
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(transport.connect(endpoint, "c")) if "zmq" in steps else None
        if "heartbeat" in steps and sock is not None:
            stack.enter_context(transport.heartbeats(sock.context, endpoint, "c"))
        if "nvml" in steps:
            probe.own_memory(gpu=True)
        if "hello" in steps:
            hello = runnerwire.hello(os.getpid(), {}, rpc_supported=ggmlrpc.supported(),
                                     devices=devices)  # fmt: skip
            if sock is not None:
                sock.send_multipart(runnerwire.encode(hello))
        if "capture" in steps:
            llamalog.capture_start(load_log)
        print("steps done; loading", flush=True)
        if "llamaopen" in steps:
            spec = specs.LoadSpec(path=model, mode="generate", n_ctx=1024, n_threads=4,
                                  n_batch=512, seed=0, chat_format=None, gpu_layers=gpu_layers)
            llm = llamaopen.open_llama(spec, 512)
        else:
            llm = llama_cpp.Llama(model_path=model, n_ctx=1024, n_gpu_layers=gpu_layers,
                                  flash_attn=True, swa_full=False, verbose=False)
        llamalog.capture_stop()
        if "zmq_after" in steps:
            stack.enter_context(transport.connect(endpoint, "c"))
        llm.eval(llm.tokenize(b"Hello there", add_bos=True)[:8])
        print("loaded and evaluated", flush=True)
        llm.close()


def _drain(endpoint: str, stop: threading.Event) -> None:
    """The parent's ROUTER (the daemon's side): reads whatever the children send."""
    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    while not stop.is_set():
        if router.poll(100):
            router.recv_multipart()
    router.close()
    ctx.term()


def configurations() -> list[tuple[str, tuple[str, ...]]]:
    """The old runner, the runner now, plain; the old runner less each step; plain plus each."""
    out = [("old-runner", OLD_RUNNER), ("runner", STEPS), ("plain", ()),
           ("runner+early_ctx", (*STEPS, *EXTRA))]
    out += [(f"old-runner-{s}", tuple(x for x in OLD_RUNNER if x != s)) for s in OLD_RUNNER]
    out += [(f"plain+{s}", (s,)) for s in STEPS if s != "zmq_first"]
    out += [("plain+zmq_first+zmq", ("zmq_first", "zmq")), *THEORY]
    return out


def run_one(name: str, steps: tuple[str, ...], endpoint: str, model: str, gpu_layers: int,
            folder: Path, preload: Path | None) -> dict[str, Any]:  # fmt: skip
    env = dict(os.environ, PYTHONFAULTHANDLER="1", MODELD_LOG_LEVEL="debug")
    if preload is not None:
        env["LD_PRELOAD"] = " ".join(p for p in (str(preload), env.get("LD_PRELOAD")) if p)
    cmd = [sys.executable, __file__, "--child", ",".join(steps), endpoint, model,
           str(gpu_layers), str(folder / f"{name}.load.log")]  # fmt: skip
    try:
        limit = float(os.environ.get("BISECT_CHILD_S", "240"))
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = None, f"timed out: {exc}"
    (folder / f"{name}.log").write_text(out)
    lines = [line for line in out.splitlines() if line.strip()]
    native = [line for line in lines if "native-backtrace" in line or ".so" in line][:40]
    sig = signal.Signals(-code).name if code is not None and code < 0 else None
    return {"kind": "bisect", "config": name, "steps": list(steps), "exit_code": code,
            "signal": sig, "ok": code == 0, "tail": lines[-12:], "native_stack": native}


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Which steps a crash needs (the old runner passes without them) and which alone crash."""
    by = {r["config"]: r for r in rows}
    if not all(name in by for name, _ in configurations()):  # a subset (--only): each row says
        return {"kind": "verdict", "text": "subset: " + ", ".join(
            f"{r['config']} {'ok' if r['ok'] else r['signal'] or r['exit_code']}" for r in rows)}
    old, new, plain = by["old-runner"]["ok"], by["runner"]["ok"], by["plain"]["ok"]
    needed = [s for s in OLD_RUNNER if not old and by[f"old-runner-{s}"]["ok"]]
    alone = [s for s in STEPS if s != "zmq_first" and not by[f"plain+{s}"]["ok"]]
    ctx_ok = by["runner+early_ctx"]["ok"]
    if old and new and plain:
        text = "every configuration loads: no crash to bisect on this build"
    elif new and not old:
        text = "the runner's early backend initialisation avoids the crash"
    elif ctx_ok and not new:
        text = ("the runner crashes unless the GPU context is created before any thread: "
                "make init_native ask the devices' memory when GPU layers are planned")
    else:
        text = "the runner still crashes: see needed/alone and the native stacks"
    return {"kind": "verdict", "old_runner_ok": old, "runner_ok": new, "plain_ok": plain,
            "runner_early_ctx_ok": ctx_ok,
            "needed": needed, "crash_alone": alone, "text": text}


def main(model: str, out: Path, gpu_layers: int = -1, only: list[str] | None = None) -> int:
    folder = Path(tempfile.mkdtemp(prefix="gpu-bisect-", dir=os.environ.get("BISECT_DIR")))
    endpoint = f"ipc://{folder / 'router.sock'}"
    preload = native_handler(folder)
    stop = threading.Event()
    drain = threading.Thread(target=_drain, args=(endpoint, stop), daemon=True)
    drain.start()
    rows: list[dict[str, Any]] = []
    with open(out, "a") as f:
        for name, steps in configurations():
            if only is not None and name not in only:
                continue
            row = run_one(name, steps, endpoint, model, gpu_layers, folder, preload)
            row["native_handler"] = preload is not None
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"{name:28s} {'ok' if row['ok'] else row['signal'] or row['exit_code']}",
                  flush=True)  # fmt: skip
        v = verdict(rows)
        f.write(json.dumps(v) + "\n")
    print(v["text"], "| needed:", v.get("needed"), "| alone:", v.get("crash_alone"), flush=True)
    print(f"logs of each child: {folder}", flush=True)
    stop.set()
    drain.join(5)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(set(filter(None, sys.argv[2].split(","))), sys.argv[3], sys.argv[4],
              int(sys.argv[5]), sys.argv[6])  # fmt: skip
    else:
        args = sys.argv[1:]
        subset = None
        if "--only" in args:
            at = args.index("--only")
            subset, args = args[at + 1].split(","), args[:at] + args[at + 2:]
        sys.exit(main(args[0], Path(args[1]), int(args[2]) if args[2:] else -1, subset))

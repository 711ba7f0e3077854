"""A runner that dies while loading is reported as what happened (issue 34): the signal, the
backend and llama.cpp's last lines of the load, not "the file may be corrupt".

The pure wording first, then a real daemon whose real runner is killed with SIGSEGV while it
is inside llama.cpp's load (stopped there first, so the kill lands during the load whatever
the machine's load).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from daemonutil import rows, until
from modeld.daemon import crashinfo
from modeld.errors import InvalidModelError, ModeldError, RunnerCrashedError

CUDA = [{"name": "CPU", "type": "cpu"}, {"name": "CUDA0", "type": "gpu", "description": "H100"}]


def test_signals_are_named() -> None:
    assert crashinfo.how_it_ended(-11) == "was killed by SIGSEGV (signal 11)"
    assert crashinfo.how_it_ended(3) == "exited with code 3"
    assert crashinfo.how_it_ended(-200) == "was killed by an unknown signal (signal 200)"


def test_backend_from_the_hello() -> None:
    assert crashinfo.backend_of(CUDA) == "CUDA"
    assert crashinfo.backend_of([{"name": "CPU", "type": "cpu"}]) == "CPU"
    assert crashinfo.backend_of([]) == "unknown"
    two = [*CUDA, {"name": "CUDA1", "type": "gpu"}, {"name": "RPC0", "type": "gpu"}]
    assert crashinfo.backend_of(two) == "CUDA+RPC"


def test_segfault_on_cuda_is_a_crash_not_a_bad_file(tmp_path: Path) -> None:
    log = tmp_path / "runner-r1.load.log"
    lines = [f"line {i}" for i in range(20)] + ["load: special tokens cache size = 3"]
    log.write_text("\n".join(lines) + "\n")
    lines = crashinfo.tail(log)
    assert lines[-1] == "load: special tokens cache size = 3" and len(lines) == crashinfo.TAIL_LINES
    err = crashinfo.load_crash("m.gguf", "/x/m.gguf", -11, CUDA, lines, log)
    assert isinstance(err, RunnerCrashedError)
    assert "while loading m.gguf on backend CUDA" in err.message
    assert "SIGSEGV" in err.message and "special tokens cache size" in err.message
    assert "--gpu-layers 0" in err.hint and "corrupt" not in err.message + err.hint
    assert err.details["backend"] == "CUDA" and err.details["exit_code"] == -11


def test_an_assertion_abort_is_still_the_files_fault() -> None:
    lines = ["llama.cpp/src/llama-model.cpp:12: GGML_ASSERT(n > 0) failed"]
    err = crashinfo.load_crash("m.gguf", "/x/m.gguf", -6, [{"name": "CPU", "type": "cpu"}], lines)
    assert isinstance(err, InvalidModelError) and "GGML_ASSERT" in err.message
    assert crashinfo.tail(None) == [] and crashinfo.tail(Path("/nonexistent/x")) == []


@pytest.mark.slow
def test_runner_killed_inside_llama_load(
    daemon_factory: Callable[..., Any], model_factory: Callable[..., Path]
) -> None:
    # big enough that its load lasts a while (tensors read, KV zeroed); tiny files load in ms
    model = model_factory("llama", n_layer=12, n_embd=1024, n_head=16, n_head_kv=4, n_ff=2816,
                          n_vocab=32000, dtype="f16")  # fmt: skip
    d = daemon_factory()
    c, loader = d.client(), d.client()  # one client per thread
    outcome: dict[str, Any] = {}
    for _attempt in range(4):  # a load that ends before it was caught is tried again
        errors: list[ModeldError] = []

        def load(errors: list[ModeldError] = errors) -> None:
            try:
                loader.load(str(model), n_ctx=4096)
            except ModeldError as exc:
                errors.append(exc)

        t = threading.Thread(target=load)
        t.start()
        pid = until(lambda: rows(c).get(model.name, {}).get("runner_pid"), 30, "its runner")
        caught = False
        for _ in range(4000):  # inside llama.cpp: its lines are in the runner's load log
            live = [p for p in d.log_dir.glob("runner-*.load.log") if p.stat().st_size > 0]
            if live and rows(c).get(model.name, {}).get("state") == "loading":
                os.kill(pid, signal.SIGSTOP)
                caught = rows(c).get(model.name, {}).get("state") == "loading"
                break
            if not t.is_alive():
                break
        if caught:
            os.kill(pid, signal.SIGSEGV)
            os.kill(pid, signal.SIGCONT)
            t.join(60)
            outcome = {"errors": errors}
            break
        os.kill(pid, signal.SIGCONT)  # stopped too late: let it finish, and try again
        t.join(60)
        c.unload(str(model))
    assert outcome, "the load always finished before it could be stopped inside llama.cpp"
    (err,) = outcome["errors"]
    assert isinstance(err, RunnerCrashedError), err
    assert "crashed while loading" in err.message and "SIGSEGV" in err.message
    assert "backend CPU" in err.message and "corrupt" not in err.message
    assert err.details["last_lines"], err.details  # llama.cpp's lines of that load
    assert d.proc.poll() is None and c.stats()["load_failures"] >= 1  # the daemon serves on

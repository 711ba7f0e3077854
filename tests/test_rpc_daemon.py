"""A model on llama.cpp RPC workers, end to end on loopback: real ``modeld rpc-worker``
processes, a real daemon and runners, real llama-cpp-python built with ``-DGGML_RPC=ON``.

Greedy output equals the local run with one and two workers (layers and KV cache reported on
RPC0/RPC1); a worker killed mid-reply is a typed error naming it and the daemon goes on; a
worker leased to one model is refused to a second one at once; an unreachable endpoint is a
clear error; a model over the daemon's own memory budget loads across two workers; the worker
refuses a non-loopback address and stops cleanly on SIGTERM and Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ggufgen
from daemonutil import rows, until
from modeld.errors import InsufficientMemoryError, RpcWorkerError
from modeld.rpc import endpoints as rpc

pytestmark = pytest.mark.slow

Factory = Callable[..., Any]
SRC = str(Path(__file__).parent.parent / "src")
#: a model that needs more memory than the capped daemon below has, spread over two workers
BIG = dict(n_layer=4, n_embd=512, n_head=8, n_ff=1408, n_vocab=32000, context_length=2048,
           dtype="f32")  # fmt: skip


def _rpc_built() -> bool:
    try:
        import llama_cpp
    except ImportError:
        return False
    return bool(llama_cpp.llama_supports_rpc())


needs_rpc = pytest.mark.skipif(not _rpc_built(), reason="llama-cpp-python built without RPC "
                               "(scripts/setup.sh builds it with -DGGML_RPC=ON)")  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (SRC, os.environ.get("PYTHONPATH")) if p), PYTHONUNBUFFERED="1")  # fmt: skip


class Worker:
    """One ``modeld rpc-worker`` subprocess on a loopback port."""

    def __init__(self, port: int | None = None, *extra: str) -> None:
        self.port = port or _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "modeld", "rpc-worker", "--port", str(self.port),
             "--threads", "1", *extra],
            env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 30.0) -> Worker:
        def up() -> bool:
            assert self.proc.poll() is None, self.output()
            try:
                rpc.probe(self.endpoint, timeout_s=2.0)
            except RpcWorkerError:
                return False
            return True

        until(up, timeout, f"rpc worker {self.endpoint}")
        return self

    def output(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stdout is not None
        return self.proc.stdout.read().decode(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@pytest.fixture
def workers() -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(port: int | None = None) -> Worker:
        w = Worker(port)
        started.append(w)
        return w.wait_ready()

    yield start
    for w in started:
        w.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def four_layers(model_factory: Factory) -> Path:
    """The tiny model with 4 layers: split over two workers, each gets layers and KV cache
    (with 2 layers the second worker gets only the output layer, which has no KV)."""
    return Path(model_factory("llama", **dict(ggufgen.TINY, n_layer=4)))


@pytest.fixture(scope="module")
def long_model(model_factory: Factory) -> Path:
    """The tiny model with a 32k training context: greedy from "a" runs thousands of tokens
    (as in test_daemon_faults.py)."""
    return Path(model_factory("llama", **dict(ggufgen.TINY, context_length=32768)))


@pytest.fixture(scope="module")
def big_model(model_factory: Factory) -> Path:
    return Path(model_factory("llama", **BIG))


def _greedy(client: Any, model: Path, prompt: str = "once upon a time", n: int = 24) -> str:
    return str(client.generate(str(model), prompt, max_tokens=n, temperature=0.0).text())


def _unload_and_wait(d: Any, model: Path) -> None:
    c = d.client()
    c.unload(str(model))
    until(lambda: model.name not in rows(c), 20, f"{model.name} unloaded")


@needs_rpc
def test_greedy_output_equals_local_on_one_and_two_workers(
    daemon_factory: Factory, four_layers: Path, workers: Callable[..., Worker]
) -> None:
    tiny_model = four_layers
    d = daemon_factory()
    c = d.client()
    local = _greedy(c, tiny_model)
    assert local
    _unload_and_wait(d, tiny_model)
    w1, w2 = workers(), workers()
    for eps in ([w1.endpoint], [w1.endpoint, w2.endpoint]):
        row = c.load(str(tiny_model), rpc=eps)
        assert row["rpc"] == eps
        assert row["layers_offloaded"] == "5/5"  # 4 layers + the output layer
        devices = {dev["device"]: dev for dev in row["devices"]}
        for i, ep in enumerate(eps):
            dev = devices[f"RPC{i}"]
            assert dev["endpoint"] == ep
            assert dev["model_bytes"] > 0 and dev["kv_bytes"] > 0, row["devices"]
            assert dev["total_bytes"] and dev["total_bytes"] > 0
        assert _greedy(c, tiny_model) == local
        assert c.stats()["rpc_leases"] == {ep: tiny_model.stem for ep in eps}
        # started as a new process, not forked (decode on workers measured 3-4% slower forked)
        with open(f"/proc/{row['runner_pid']}/cmdline", "rb") as fh:
            assert b"-m\0modeld.runner\0--endpoint" in fh.read()
        # unloading ends the runner (its registrations cannot be undone) and frees the workers
        _unload_and_wait(d, tiny_model)
        until(lambda: not c.stats()["rpc_leases"], 20, "leases released")
    assert c.stats()["rpc_supported"] is True
    assert "rpc workers" in d.log_text()
    # other workers for a loaded model: a reload, whose new runner waits for the old one to
    # exit and give the worker back
    c.load(str(tiny_model), rpc=[w1.endpoint, w2.endpoint])
    row = c.load(str(tiny_model), rpc=[w2.endpoint])
    assert row["rpc"] == [w2.endpoint]
    assert c.stats()["rpc_leases"] == {w2.endpoint: tiny_model.stem}
    assert _greedy(c, tiny_model) == local


@needs_rpc
def test_worker_killed_mid_reply_is_a_typed_error_naming_it(
    daemon_factory: Factory, long_model: Path, tiny_model: Path, workers: Callable[..., Worker]
) -> None:
    d = daemon_factory()
    c = d.client()
    w = workers()
    c.load(str(long_model), n_ctx=8192, rpc=[w.endpoint])
    gen = c.generate(str(long_model), "a", max_tokens=8000, temperature=0.0)
    t0 = time.monotonic()
    with pytest.raises(RpcWorkerError) as info:
        for i, _piece in enumerate(gen):
            if i == 3:
                w.proc.kill()
    assert time.monotonic() - t0 < 30
    assert info.value.details["endpoint"] == w.endpoint
    assert info.value.details["problem"] == "lost"
    assert f"rpc worker {w.endpoint} lost" in info.value.message
    assert d.proc.poll() is None
    until(lambda: not c.stats()["rpc_leases"], 20, "leases released")
    # the worker is down: the next load says so (no abort, no cool-down on the file) ...
    with pytest.raises(RpcWorkerError) as down:
        c.load(str(long_model), rpc=[w.endpoint])
    assert down.value.details["problem"] == "unreachable"
    # ... and once it is back, the model loads and answers again
    workers(w.port)
    c.load(str(long_model), rpc=[w.endpoint])
    assert _greedy(c, long_model, n=4)
    assert c.generate(str(tiny_model), "and locally?", max_tokens=2).text() is not None


@needs_rpc
def test_a_leased_worker_is_refused_to_a_second_model_at_once(
    daemon_factory: Factory, tiny_model: Path, tiny_chat_model: Path,
    workers: Callable[..., Worker],
) -> None:  # fmt: skip
    d = daemon_factory()
    c = d.client()
    w = workers()
    c.load(str(tiny_model), rpc=[w.endpoint])
    t0 = time.monotonic()
    with pytest.raises(RpcWorkerError) as info:
        c.load(str(tiny_chat_model), rpc=[w.endpoint])
    assert time.monotonic() - t0 < 5
    assert info.value.details["problem"] == "leased"
    assert info.value.details["leased_to"] == tiny_model.stem
    assert "modeld unload" in info.value.hint
    assert _greedy(c, tiny_model, n=4)  # the first model is untouched


@needs_rpc
def test_unreachable_and_busy_endpoints_are_clear_errors(
    daemon_factory: Factory, tiny_model: Path, workers: Callable[..., Worker]
) -> None:
    d = daemon_factory()
    c = d.client()
    dead = f"127.0.0.1:{_free_port()}"
    with pytest.raises(RpcWorkerError) as info:
        c.load(str(tiny_model), rpc=[dead])
    assert info.value.details == {"endpoint": dead, "problem": "unreachable"}
    # a worker held by a client outside this daemon: a plain connection that said HELLO
    w = workers()
    with socket.create_connection(("127.0.0.1", w.port)) as foreign:
        foreign.sendall(bytes([14]) + (24).to_bytes(8, "little") + bytes(24))
        foreign.recv(8)
        t0 = time.monotonic()
        with pytest.raises(RpcWorkerError) as busy:
            c.load(str(tiny_model), rpc=[w.endpoint])
        assert time.monotonic() - t0 < 15
        assert busy.value.details["problem"] == "busy"
    assert d.proc.poll() is None
    assert "runner_crashed" not in d.log_text()
    assert c.generate(str(tiny_model), "still here", max_tokens=2).text() is not None


@needs_rpc
def test_moving_a_loaded_model_onto_unreachable_workers_keeps_it_loaded(
    daemon_factory: Factory, tiny_model: Path
) -> None:
    """A reload onto workers that refuse a connection fails before the model is unloaded:
    the working local load (its runner, its context) stays and answers."""
    d = daemon_factory()
    c = d.client()
    before = c.load(str(tiny_model))
    dead = f"127.0.0.1:{_free_port()}"
    with pytest.raises(RpcWorkerError) as info:
        c.load(str(tiny_model), rpc=[dead])
    assert info.value.details == {"endpoint": dead, "problem": "unreachable"}
    [row] = c.ps()
    assert row["state"] == "ready" and row["runner_pid"] == before["runner_pid"]
    assert not row.get("rpc")
    assert c.generate(str(tiny_model), "still here", max_tokens=2).text() is not None


@needs_rpc
def test_a_model_over_the_daemon_budget_loads_across_two_workers(
    daemon_factory: Factory, big_model: Path, workers: Callable[..., Worker]
) -> None:
    size = big_model.stat().st_size
    # a quarter of the weights short of what the model needs locally (the runner's baseline
    # measured as this daemon starts its runners: forked ones share the daemon's pages), and
    # room for what stays local on workers (the input embedding, the CPU's compute buffer)
    probe = daemon_factory("--parallel", "1")
    need = int(probe.client().show(str(big_model))["need_bytes"])
    probe.stop()
    d = daemon_factory("--memory-cap", str(need - size // 4), "--parallel", "1")
    c = d.client()
    with pytest.raises(InsufficientMemoryError):
        c.load(str(big_model))
    w1, w2 = workers(), workers()
    row = c.load(str(big_model), rpc=[w1.endpoint, w2.endpoint])
    devices = {dev["device"]: dev for dev in row["devices"]}
    on_workers = devices["RPC0"]["model_bytes"] + devices["RPC1"]["model_bytes"]
    assert devices["RPC0"]["model_bytes"] > 0 and devices["RPC1"]["model_bytes"] > 0
    assert on_workers > size // 2, row["devices"]
    stats = c.stats()
    assert stats["used_bytes"] <= stats["budget_bytes"], stats
    assert _greedy(c, big_model, n=8)


def test_worker_refuses_a_non_loopback_address_and_stops_cleanly() -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "modeld", "rpc-worker", "--host", "0.0.0.0", "--port",
         str(_free_port())],
        env=_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "refusing to listen on 0.0.0.0" in refused.stderr
    assert "tunnel" in refused.stderr
    if not _rpc_built():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        w = Worker(None, "--host", "0.0.0.0", "--allow-insecure-network")
        w.endpoint = f"127.0.0.1:{w.port}"
        w.wait_ready()
        assert w.stop(sig) == 0
        out = w.output()
        assert "no authentication" in out and "stopped" in out


def test_rpc_worker_without_the_backend_is_a_clear_error() -> None:
    if _rpc_built():
        pytest.skip("this build has the RPC backend")
    res = subprocess.run(
        [sys.executable, "-m", "modeld", "rpc-worker", "--port", str(_free_port())],
        env=_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 14 and "-DGGML_RPC=ON" in res.stderr


@needs_rpc
def test_config_names_a_models_workers_for_every_api(
    daemon_factory: Factory, tiny_model: Path, workers: Callable[..., Worker], tmp_path: Path
) -> None:
    import http.client
    import json

    w = workers()
    root = tmp_path / "d"
    (root / "log").mkdir(parents=True)
    port = _free_port()
    (root / "config.toml").write_text(
        f'[aliases]\nfar = "{tiny_model}"\n[rpc]\nfar = ["{w.endpoint}"]\n'
    )
    d = daemon_factory(root=root, env={"MODELD_HTTP": f"127.0.0.1:{port}"})
    c = d.client()
    planned = c.show("far")  # planned for the workers: their share is not local memory
    assert planned["rpc"] == [w.endpoint] and planned["estimate"]["vram"] > 0
    assert planned["estimate"]["weights"] < tiny_model.stat().st_size
    (share,) = planned["rpc_shares"]  # the worker's own share: every layer, its KV cache
    assert share["endpoint"] == w.endpoint and share["layers"] == 3 and share["kv_bytes"] > 0
    # the HTTP API (Ollama's) loads it on the worker through the alias ...
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/api/generate", json.dumps({
        "model": "far", "prompt": "hi", "stream": False,
        "options": {"temperature": 0, "num_predict": 4}}))  # fmt: skip
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    assert json.loads(resp.read())["done"] is True
    row = rows(c)[tiny_model.name]
    rpc0 = next(dev for dev in row["devices"] if dev["device"] == "RPC0")
    assert row["rpc"] == [w.endpoint] and rpc0["model_bytes"] > 0
    # ... and a plain request for the same file under its path shares that load
    assert c.generate(str(tiny_model), "hi", max_tokens=2).text() is not None
    assert rows(c)[tiny_model.name]["runner_pid"] == row["runner_pid"]


def test_a_load_on_workers_without_the_backend_is_a_clear_error(
    daemon_factory: Factory, tiny_model: Path
) -> None:
    if _rpc_built():
        pytest.skip("this build has the RPC backend")
    d = daemon_factory()
    c = d.client()
    with pytest.raises(RpcWorkerError) as info:
        c.load(str(tiny_model), rpc=[f"127.0.0.1:{_free_port()}"])
    assert info.value.details["problem"] == "not_built"
    assert "-DGGML_RPC=ON" in info.value.hint
    assert c.stats()["rpc_supported"] is False
    assert c.generate(str(tiny_model), "local is fine", max_tokens=2).text() is not None


@needs_rpc
def test_a_worker_that_stops_answering_is_a_typed_error_within_the_stall_bound(
    daemon_factory: Factory, long_model: Path, workers: Callable[..., Worker]
) -> None:
    d = daemon_factory("--runner-stall", "3")
    c = d.client()
    w = workers()
    c.load(str(long_model), n_ctx=8192, rpc=[w.endpoint])
    gen = c.generate(str(long_model), "a", max_tokens=8000, temperature=0.0)
    try:
        with pytest.raises(RpcWorkerError) as info:
            for i, _piece in enumerate(gen):
                if i == 3:  # the host hangs: the connection stays open, nothing answers
                    w.proc.send_signal(signal.SIGSTOP)
                    t0 = time.monotonic()
        assert time.monotonic() - t0 < 15
    finally:
        w.proc.kill()
    assert info.value.details["problem"] == "stalled"
    assert f"rpc worker {w.endpoint} stopped answering" in info.value.message
    assert d.proc.poll() is None
    until(lambda: not c.stats()["rpc_leases"], 20, "leases released")
    assert c.generate(str(long_model), "locally", max_tokens=2).text() is not None


@needs_rpc
def test_cli_load_run_and_ps_with_workers(
    daemon_factory: Factory, tiny_model: Path, workers: Callable[..., Worker]
) -> None:
    import json

    d = daemon_factory()
    w = workers()

    def modeld(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "modeld", *args], env=d.env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    bad = modeld("load", str(tiny_model), "--rpc", "nope")
    assert bad.returncode == 2 and "HOST:PORT" in bad.stderr
    loaded = modeld("load", str(tiny_model), "--rpc", w.endpoint, "--json")
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout)["model"]["rpc"] == [w.endpoint]
    ps = modeld("ps")
    assert f"RPC0 {w.endpoint}: weights" in ps.stdout, ps.stdout
    assert "(planned with compute " in ps.stdout, ps.stdout
    ran = modeld("run", str(tiny_model), "hello", "--rpc", w.endpoint, "--max-tokens", "3")
    assert ran.returncode == 0, ran.stderr
    stats = json.loads(modeld("stats", "--json").stdout)
    assert stats["rpc_supported"] is True and stats["rpc_leases"] == {w.endpoint: tiny_model.stem}
    w.proc.kill()
    w.proc.wait(5)
    gone = modeld("load", str(tiny_model), "--rpc", f"127.0.0.1:{_free_port()}")
    assert gone.returncode == 14 and "unreachable" in gone.stderr

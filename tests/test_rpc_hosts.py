"""llama.cpp RPC workers (issue 35, findings 9 and 10), end to end on loopback with a real
daemon and real ``modeld rpc-worker`` processes: a load onto a port that is no worker fails
before the working model is unloaded (each new worker is asked HELLO, off the daemon's loop),
and ``rpc-worker --host`` takes ``localhost`` and says clearly that llama.cpp's RPC speaks
IPv4 only (``::1``, ``[::1]``)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from daemonutil import until
from modeld.errors import InvalidRequestError, RpcWorkerError
from modeld.rpc import endpoints as rpc
from test_rpc_daemon import Worker, _env, _free_port, needs_rpc

pytestmark = pytest.mark.slow


@needs_rpc
def test_a_load_onto_ports_that_are_no_workers_keeps_the_loaded_model(
        daemon_factory: Any, tiny_model: Path, q8_model: Path) -> None:
    port = _free_port()
    d = daemon_factory("--http", f"127.0.0.1:{port}")
    c = d.client()
    before = c.load(str(tiny_model))
    c.load(str(q8_model))
    # the daemon's own HTTP port accepts TCP (what was checked before) but is no worker
    with pytest.raises(RpcWorkerError) as info:
        c.load(str(tiny_model), rpc=[f"127.0.0.1:{port}"])
    assert info.value.details["problem"] == "version", info.value.details
    assert f"127.0.0.1:{port}" in info.value.message
    # a port that accepts and never answers: "busy" once the probe times out; meanwhile the
    # daemon's loop serves everyone else (the HELLO runs in a thread)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever reads
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        failed: list[BaseException] = []

        def load() -> None:
            try:
                d.client().load(str(tiny_model), rpc=[endpoint])
            except BaseException as exc:
                failed.append(exc)

        t = threading.Thread(target=load)
        t0 = time.monotonic()
        t.start()
        time.sleep(0.5)
        served = []
        while t.is_alive() and time.monotonic() - t0 < rpc.PROBE_TIMEOUT_S - 0.5:
            s0 = time.monotonic()
            c.ps()
            served.append(time.monotonic() - s0)
            time.sleep(0.1)
        text = c.generate(str(q8_model), "beside", max_tokens=2).text()
        t.join(30)
    assert served and max(served) < 1.0, served  # never held by the probe (generous bound)
    assert text is not None
    assert len(failed) == 1 and isinstance(failed[0], RpcWorkerError), failed
    assert failed[0].details["problem"] == "busy" and endpoint in failed[0].message
    rows = {r["name"]: r for r in c.ps()}
    row = rows[tiny_model.stem]
    assert row["state"] == "ready" and row["runner_pid"] == before["runner_pid"]
    assert not row.get("rpc")
    assert "(reload)" not in d.log_text()  # nothing was unloaded for the failed loads
    assert c.generate(str(tiny_model), "still here", max_tokens=2).text() is not None
    # a model not loaded: the workers are asked before admission (which could evict idle
    # models for it) and before a plain request for the model could join its load
    c.unload(str(tiny_model))
    until(lambda: tiny_model.stem not in {r["name"] for r in c.ps()}, 20, "unloaded")
    def loads() -> int:
        return (d.log_dir / "modeld.log").read_text().count(f"loading {tiny_model.stem} ")

    loads_before = loads()
    failed.clear()
    endpoint = f"127.0.0.1:{port}"
    t = threading.Thread(target=load)
    t.start()
    plain = c.generate(str(tiny_model), "plain", max_tokens=2).text()  # loads it locally
    t.join(30)
    assert plain is not None
    assert len(failed) == 1 and failed[0].details["problem"] == "version"  # type: ignore[attr-defined]
    assert loads() == loads_before + 1  # the plain request's; none for the refused one
    assert {r["name"] for r in c.ps()} == {tiny_model.stem, q8_model.stem}  # nothing evicted


def test_ipv6_hosts_are_refused_with_the_reason() -> None:
    for host in ("::1", "[::1]", "fe80::1"):
        out = subprocess.run(
            [sys.executable, "-m", "modeld", "rpc-worker", "--host", host, "--port",
             str(_free_port()), "--allow-insecure-network"],
            env=_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 2, out.stderr
        assert "IPv4 only" in out.stderr and "--host 127.0.0.1" in out.stderr
        assert "Address family" not in out.stderr and "refusing" not in out.stderr
    assert rpc.listen_address("localhost") == "127.0.0.1"
    assert rpc.listen_address(" 127.0.0.2 ") == "127.0.0.2"
    with pytest.raises(InvalidRequestError, match="no IPv4 address"):
        rpc.listen_address("no-such-host.invalid")


@needs_rpc
def test_a_worker_on_localhost_listens_on_the_ipv4_loopback() -> None:
    w = Worker(None, "--host", "localhost")
    try:
        w.wait_ready()  # probes 127.0.0.1:PORT with HELLO
        hello = rpc.probe(f"localhost:{w.port}")  # the client resolves the name as llama.cpp
        assert hello.major == rpc.PROTO_MAJOR
    finally:
        assert w.stop() == 0
    out = w.output()
    assert f"serving CPU on 127.0.0.1:{w.port}" in out and "no authentication" not in out

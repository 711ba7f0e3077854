"""llama.cpp RPC workers, the pure parts: endpoint syntax, the loopback rule, leases, the load
request's ``rpc`` field, the ``[rpc]`` config table, llama.cpp's buffer log lines, and the
handshake probe against real sockets (a closed port, a listener that never answers)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from modeld.config import load_settings
from modeld.daemon.leases import RpcLeases
from modeld.errors import InvalidRequestError, RpcWorkerError, error_from_dict
from modeld.rpc import endpoints as rpc
from modeld.wire import protocol, reqparse


def test_endpoints_parse_and_normalise() -> None:
    assert rpc.parse_endpoints("127.0.0.1:50052, localhost:50053") == (
        "127.0.0.1:50052", "localhost:50053",
    )  # fmt: skip
    assert rpc.parse_endpoints(["10.0.0.5:1"]) == ("10.0.0.5:1",)
    for bad in ("127.0.0.1", "host:", ":50052", "h:0", "h:70000", "h:5x", "[::1]:50052", ""):
        with pytest.raises(InvalidRequestError):
            rpc.parse_endpoints(bad)
    with pytest.raises(InvalidRequestError, match="twice"):
        rpc.parse_endpoints("a:1,a:1")


def test_loopback_rule() -> None:
    assert rpc.is_loopback("127.0.0.1") and rpc.is_loopback("127.1.2.3")
    assert rpc.is_loopback("localhost") and rpc.is_loopback("::1")
    assert not rpc.is_loopback("0.0.0.0") and not rpc.is_loopback("10.0.0.5")
    assert not rpc.is_loopback("example.org")


def test_load_request_rpc_field() -> None:
    msg = protocol.Message("load", "r1", {"model": "m", "rpc": ["127.0.0.1:50052", "h:2"]})
    req = reqparse.parse_request(msg)
    assert isinstance(req, reqparse.LoadRequest) and req.rpc == ("127.0.0.1:50052", "h:2")
    none = reqparse.parse_request(protocol.Message("load", "r2", {"model": "m"}))
    assert isinstance(none, reqparse.LoadRequest) and none.rpc is None
    for bad in (5, ["nope"], [1], []):
        with pytest.raises(InvalidRequestError, match="rpc"):
            reqparse.parse_request(protocol.Message("load", "r3", {"model": "m", "rpc": bad}))


def test_config_rpc_table(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[aliases]\nbig = "/m/big.gguf"\n[rpc]\nbig = ["127.0.0.1:50052", "h:2"]\n'
                   'other = "a:1,b:2"\n')  # fmt: skip
    s, _ = load_settings(env={}, config_path=cfg)
    assert s.rpc == {"big": ("127.0.0.1:50052", "h:2"), "other": ("a:1", "b:2")}
    cfg.write_text('[rpc]\nbig = ["nope"]\n')
    with pytest.raises(InvalidRequestError, match="big"):
        load_settings(env={}, config_path=cfg)


def test_leases() -> None:
    leases = RpcLeases()
    leases.take(["a:1", "b:2"], "r1", "big")
    assert [lease.runner_id for lease in leases.held(["b:2", "c:3"])] == ["r1"]
    leases.take(["a:1"], "r1", "big")  # its own again: fine
    with pytest.raises(ValueError):
        leases.take(["a:1"], "r2", "other")
    assert sorted(leases.release("r1")) == ["a:1", "b:2"]
    assert leases.held(["a:1", "b:2"]) == [] and leases.release("r1") == []


def test_rpc_error_round_trips() -> None:
    err = rpc.worker_error("h:1", "rpc worker h:1 lost", "restart it", "lost")
    back = error_from_dict(err.to_dict())
    assert isinstance(back, RpcWorkerError) and back.details["endpoint"] == "h:1"
    assert back.exit_code == 14


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_probe_unreachable_names_the_endpoint() -> None:
    ep = f"127.0.0.1:{_free_port()}"
    with pytest.raises(RpcWorkerError) as info:
        rpc.probe(ep, timeout_s=1.0)
    assert info.value.details == {"endpoint": ep, "problem": "unreachable"}
    assert ep in info.value.message and not rpc.reachable(ep)
    assert rpc.lost_workers([ep]) == [ep]


def test_probe_silent_listener_is_busy_within_the_timeout() -> None:
    # what a worker serving another client looks like: the connection is accepted into the
    # backlog, and nothing answers HELLO
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        ep = f"127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(RpcWorkerError) as info:
            rpc.probe(ep, timeout_s=0.5)
        assert time.monotonic() - t0 < 3
        assert info.value.details["problem"] == "busy"
        assert rpc.reachable(ep)


def test_probe_closed_connection_is_a_version_mismatch() -> None:
    # a worker of another protocol version reads HELLO's size, finds it wrong and hangs up
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        ep = f"127.0.0.1:{listener.getsockname()[1]}"
        import threading

        def hang_up() -> None:
            conn, _ = listener.accept()
            conn.recv(9)
            conn.close()

        t = threading.Thread(target=hang_up)
        t.start()
        with pytest.raises(RpcWorkerError) as info:
            rpc.probe(ep, timeout_s=2.0)
        t.join()
        assert info.value.details["problem"] == "version"
        assert "same llama-cpp-python" in info.value.hint


# llama.cpp's lines from a 2-worker load (this build; an RPC buffer is named by the device's
# index on its own server, so both workers' are RPC0[...]: the endpoint tells them apart)
LOAD_LOG = [
    "load_tensors: offloading output layer to GPU",
    "load_tensors: offloaded 3/3 layers to GPU",
    "load_tensors:   CPU_Mapped model buffer size =     0.12 MiB",
    "load_tensors: RPC0[127.0.0.1:50052] model buffer size =     0.25 MiB",
    "load_tensors: RPC0[127.0.0.1:50053] model buffer size =     0.31 MiB",
    "llama_kv_cache: RPC0[127.0.0.1:50052] KV buffer size =     1.00 MiB",
    "llama_kv_cache: RPC0[127.0.0.1:50053] KV buffer size =     1.00 MiB",
    "sched_reserve: RPC0[127.0.0.1:50052] compute buffer size =     2.50 MiB",
    "sched_reserve:        CPU compute buffer size =     0.50 MiB",
]


def test_buffer_log_lines_become_device_shares() -> None:
    pytest.importorskip("llama_cpp")
    from modeld.rpc import ggml as ggmlrpc

    found = ggmlrpc.shares(LOAD_LOG)
    mib = 1024 * 1024
    assert found["layers"] == {"offloaded": 3, "total": 3}
    assert found["buffers"]["127.0.0.1:50052"] == {
        "model": mib // 4, "kv": mib, "compute": int(2.5 * mib)}  # fmt: skip
    assert found["buffers"]["127.0.0.1:50053"] == {"model": int(0.31 * mib), "kv": mib}
    assert found["buffers"]["CPU"] == {"model": int(0.12 * mib), "compute": mib // 2}


@pytest.mark.parametrize(("version", "legacy"), [((8, 0, 0), False), ((7, 1, 0), False),
                                                  ((3, 0, 0), True)])  # fmt: skip
def test_probe_names_both_versions_of_a_worker_of_another_release(
    version: tuple[int, int, int], legacy: bool
) -> None:
    from rpcfake import FakeWorker

    fake = FakeWorker(version, legacy=legacy)
    try:
        with pytest.raises(RpcWorkerError) as info:
            rpc.probe(fake.endpoint, timeout_s=2.0)
    finally:
        fake.close()
    theirs = ".".join(map(str, version))
    assert info.value.details["problem"] == "version"
    assert info.value.details["worker_version"] == theirs
    assert info.value.details["client_version"] == "7.0.0"
    assert f"protocol {theirs}" in info.value.message and "speaks 7.0.x" in info.value.message


def test_probe_reads_a_workers_device_memory() -> None:
    from rpcfake import FakeWorker

    fake = FakeWorker((7, 0, 3), memory=(5 << 30, 6 << 30))
    try:
        hello = rpc.probe(fake.endpoint, timeout_s=2.0)
    finally:
        fake.close()
    assert hello.version == "7.0.3"
    assert hello.devices == (rpc.DeviceMemory(0, 5 << 30, 6 << 30),) and hello.free == 5 << 30

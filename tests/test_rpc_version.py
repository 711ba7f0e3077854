"""A worker of another llama.cpp release, end to end: the daemon's load fails with a typed
``rpc_worker`` error (problem "version") naming both protocol versions, the runner does not
abort, the worker's lease is given back and the daemon goes on serving. The worker is
tests/rpcfake.py, answering HELLO byte for byte as ggml-rpc.cpp of that release does: no
other llama.cpp build with another protocol is on this machine (the llama-server peer build
in the bench cache speaks 7.0.0, as llama-cpp-python 0.3.36 does, and has no rpc-server)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from daemonutil import until
from modeld.errors import RpcWorkerError
from rpcfake import FakeWorker
from test_rpc_daemon import needs_rpc

pytestmark = pytest.mark.slow


@needs_rpc
@pytest.mark.parametrize(("version", "legacy"), [((3, 0, 0), True), ((8, 1, 0), False)])
def test_a_worker_of_another_release_is_a_version_error_naming_both(
    daemon_factory: Callable[..., Any], tiny_model: Path, version: tuple[int, int, int],
    legacy: bool,
) -> None:  # fmt: skip
    fake = FakeWorker(version, legacy=legacy)
    try:
        d = daemon_factory()
        c = d.client()
        with pytest.raises(RpcWorkerError) as info:
            c.load(str(tiny_model), rpc=[fake.endpoint])
        theirs = ".".join(map(str, version))
        assert info.value.details["problem"] == "version"
        assert info.value.details["endpoint"] == fake.endpoint
        assert f"protocol {theirs}" in info.value.message, info.value.message
        assert "this build speaks 7.0.x" in info.value.message
        assert fake.hellos >= 1
        until(lambda: not c.stats()["rpc_leases"], 20, "lease given back")
        assert "SIGABRT" not in d.log_text() and "crashed" not in d.log_text()
        row = c.load(str(tiny_model))  # the daemon goes on
        assert row["state"] == "ready"
    finally:
        fake.close()

"""Several daemons behind Ray Serve (issue 24): a ``ray.cluster_utils.Cluster`` of two simulated
nodes on this machine, a real daemon per node (own socket, state dirs, one model slot each),
tiny generated models, requests through the cluster's HTTP ingress.

One cluster for the module (starting Ray costs ~15 s here); the tests run in order and build on
each other's state, as a day of a two-machine cluster would: sticky placement, a third model
placed where an idle model can go, a daemon-side eviction, streaming and disconnects, and last
a node removed.
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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.cluster
ray = pytest.importorskip(
    "ray", reason="needs the modeld[ray] extra (pip install 'modeld[ray]'): Ray Serve")

import ggufgen  # noqa: E402
from daemonutil import until  # noqa: E402
from modeld.client import Client  # noqa: E402

LONG = dict(ggufgen.TINY, context_length=32768)
SRC = str(Path(__file__).parent.parent / "src")


class Daemon:
    """A daemon of one simulated machine: its own socket, dirs and one model slot."""

    def __init__(self, name: str, models: Path) -> None:
        self.name = name
        self.models = models
        self.root = Path(tempfile.mkdtemp(prefix=f"mc-{name}-", dir="/tmp"))
        (self.root / "log").mkdir()
        (self.root / "config.toml").touch()
        self.start()

    def start(self) -> None:
        self.endpoint = f"ipc://{self.root / 'run' / 'modeld.sock'}"
        self.env = {
            "MODELD_SOCKET": self.endpoint, "MODELD_RUNTIME_DIR": str(self.root / "run"),
            "MODELD_LOG_DIR": str(self.root / "log"),
            "MODELD_CONFIG": str(self.root / "config.toml"), "MODELD_MODELS": str(self.models),
            "MODELD_PROMPT_CACHE_DIR": str(self.root / "prompts"), "MODELD_HTTP": "off",
            "MODELD_NODE_NAME": self.name, "MODELD_NO_AUTOSTART": "1",
        }
        env = dict(os.environ, **self.env, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
        with open(self.root / "log" / "daemon.stderr", "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "modeld.daemon", "--max-models", "1",
                 "--prompt-cache-mib", "0", "--keep-alive", "-1"],
                env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT)
        self.client = Client(self.endpoint, timeout=60.0, connect_timeout=10.0)
        until(self._answers, timeout=30, what=f"daemon {self.name} up")

    def _answers(self) -> bool:
        return (self.root / "run" / "modeld.sock").exists() and _quietly(self.client.ping)

    def loaded(self) -> set[str]:
        return {r["name"] for r in self.client.ps() if r["state"] in ("ready", "loading")}

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.root, ignore_errors=True)


class Setup:
    def __init__(self, cluster: Any, worker: Any, daemons: dict[str, Daemon], url: str) -> None:
        self.cluster, self.worker, self.daemons, self.url = cluster, worker, daemons, url
        self.http = httpx.Client(base_url=url, timeout=60.0)

    def generate(self, model: str, **extra: Any) -> httpx.Response:
        r = self.http.post("/api/generate", json={"model": model, "prompt": "hello",
                                                   "stream": False, "options": {
                                                       "num_predict": 3, "temperature": 0}},
                           **extra)
        assert r.status_code == 200, r.text
        assert r.json()["done"] is True
        return r

    def holder(self, model: str) -> set[str]:
        return {n for n, d in self.daemons.items() if model in d.loaded()}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    from ray.cluster_utils import Cluster

    models = tmp_path_factory.mktemp("cluster-models")
    # seeds whose greedy reply to "a" runs to the token limit (a and b: long generations to
    # hold a model busy) and one that stops early (c)
    for name, seed in (("a", 1), ("b", 3), ("c", 2)):
        ggufgen.make_llama_model(models / f"{name}.gguf", **dict(LONG, seed=seed))
    daemons = {name: Daemon(name, models) for name in ("alpha", "beta")}
    small = {"object_store_memory": 100 * 1024 * 1024, "num_cpus": 1}
    cluster = Cluster(initialize_head=True, head_node_args={
        **small, "resources": {"modeld": 1}, "include_dashboard": False,
        "env_vars": daemons["alpha"].env})
    worker = cluster.add_node(**small, resources={"modeld": 1}, env_vars=daemons["beta"].env)
    try:
        ray.init(address=cluster.address, logging_level="warning", log_to_driver=False)
        out = _cli("cluster", "serve", "--address", cluster.address, "--http",
                   f"127.0.0.1:{_free_port()}", "--json")
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert (got["kind"], got["nodes"], got["policy"]) == ("cluster_serve", 2, "placement")
        s = Setup(cluster, worker, daemons, got["url"])
        until(lambda: _quietly(lambda: [n["up"] for n in s.http.get("/cluster/ps").json()[
            "nodes"]] == [True, True]), timeout=120, what="both node deployments up")
        yield s
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        for d in daemons.values():
            d.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``modeld ARGS`` with an empty config (not this machine's)."""
    config = Path(tempfile.mkdtemp(prefix="mc-cfg-", dir="/tmp")) / "config.toml"
    config.touch()
    env = dict(os.environ, MODELD_CONFIG=str(config), PYTHONPATH=os.pathsep.join(
        p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "modeld", *args], env=env, text=True,
                          capture_output=True, timeout=120)


def _quietly(fn: Any) -> bool:
    """``fn()`` is truthy, and raised nothing (the thing polled is not up yet)."""
    try:
        return bool(fn())
    except Exception:
        return False


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_requests_for_a_model_stick_to_the_node_that_holds_it(setup: Setup) -> None:
    setup.generate("a")
    (a_node,) = setup.holder("a")
    setup.generate("b")  # a slot is free on the other node: b goes there, a stays
    (b_node,) = setup.holder("b")
    assert b_node != a_node
    for _ in range(3):  # each reply names the node that served it
        assert setup.generate("a").headers["x-modeld-node"] == a_node
        assert setup.generate("b").headers["x-modeld-node"] == b_node
    assert setup.holder("a") == {a_node} and setup.holder("b") == {b_node}
    for d in setup.daemons.values():  # each model was loaded once, on one node
        assert d.client.stats()["loads"] == 1
    ps = setup.http.get("/cluster/ps").json()
    assert {m["name"] for n in ps["nodes"] for m in n["models"]} == {"a", "b"}


def _busy(setup: Setup, model: str) -> tuple[httpx.Response, Iterator[str]]:
    """A long streamed generation held open (read one line, then leave it)."""
    req = setup.http.build_request("POST", "/api/generate", json={
        "model": model, "prompt": "a", "stream": True,
        "options": {"num_predict": 30000, "temperature": 0}})
    resp = setup.http.send(req, stream=True)
    lines = resp.iter_lines()
    assert json.loads(next(lines))["model"] == model
    return resp, lines


def test_a_third_model_goes_where_the_idle_model_can_go(setup: Setup) -> None:
    (a_node,) = setup.holder("a")
    (b_node,) = setup.holder("b")
    resp, _ = _busy(setup, "a")
    try:
        until(lambda: any(r["in_flight"] for r in setup.daemons[a_node].client.ps()),
              what="a busy")
        setup.generate("c")  # fits nowhere without evicting: not the busy a, the idle b
        assert setup.holder("c") == {b_node} and setup.holder("a") == {a_node}
        assert [r["in_flight"] for r in setup.daemons[a_node].client.ps()] == [1]  # still busy
    finally:
        resp.close()


def test_a_daemon_side_eviction_is_reflected_in_routing(setup: Setup) -> None:
    (a_node,) = setup.holder("a")
    (c_node,) = setup.holder("c")
    setup.daemons[c_node].client.unload("c")  # c_node is now empty ...
    setup.daemons[a_node].client.load("b")  # ... and a_node's daemon evicts a for b
    until(lambda: setup.daemons[a_node].loaded() == {"b"}, what="a evicted on its daemon")
    setup.generate("a")  # placed from what the daemons hold now: the empty node
    assert setup.holder("a") == {c_node}
    setup.generate("b")  # b stays where the daemon loaded it
    assert setup.holder("b") == {a_node}


def test_streaming_through_the_ingress_ndjson_and_sse(setup: Setup) -> None:
    with setup.http.stream("POST", "/api/generate", json={
            "model": "a", "prompt": "hi", "stream": True,
            "options": {"num_predict": 8, "temperature": 0}}) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(x) for x in r.iter_lines() if x]
    assert len(lines) >= 2 and lines[-1]["done"] is True
    with setup.http.stream("POST", "/v1/chat/completions", json={
            "model": "b", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_tokens": 8, "temperature": 0}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [x for x in r.iter_lines() if x.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


def test_a_client_that_leaves_cancels_on_the_daemon(setup: Setup) -> None:
    resp, _ = _busy(setup, "a")
    node = resp.headers["x-modeld-node"]  # the daemon that serves it (not a guess from ps)
    client = setup.daemons[node].client
    failed = None
    try:
        until(lambda: any(r["in_flight"] for r in client.ps()), what=f"a generating on {node}")
        resp.close()
        until(lambda: not any(r["in_flight"] for r in client.ps()), timeout=30,
              what=f"the generation cancelled on {node}")
    except AssertionError as exc:
        failed = f"{exc}\n{_explain(setup)}"
    finally:
        resp.close()
    if failed:  # the context first, without a traceback: CI shows the start of a failure
        pytest.fail(failed, pytrace=False)


def _explain(setup: Setup) -> str:
    """Each daemon's ps and log tail, the ingress's counts, and Serve's logs on cancels and
    disconnects (a failure's context: where the cancel stopped), short lines first."""
    out = []
    try:
        nodes = setup.http.get("/cluster/ps", timeout=10).json()["nodes"]
        out.append(f"ingress: {[(n['node'], n['in_flight'], n['up']) for n in nodes]}")
    except Exception as exc:
        out.append(f"ingress: no answer ({exc!r})")
    for name, d in setup.daemons.items():
        try:
            ps: object = [{k: r.get(k) for k in ("name", "state", "in_flight", "n_ctx")}
                          for r in d.client.ps()]
        except Exception as exc:  # the daemon does not answer: that is the context
            ps = exc
        log = (d.root / "log" / "modeld.log").read_text(errors="replace").splitlines()[-12:]
        out.append(f"{name}: {ps!r}\n" + "\n".join(line[:240] for line in log))
    try:  # and Serve's: did the proxy see the client leave, did a replica log the cancel
        logs = Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"
        for path in sorted(logs.glob("proxy_*.log")) + sorted(logs.glob("replica_*.log")):
            lines = path.read_text(errors="replace").splitlines()
            told = [x for x in lines if any(w in x.lower() for w in (
                "cancel", "disconnect", "error", "exception"))][-6:]
            out.append(f"{path.name}:\n" + "\n".join(x[:240] for x in told + lines[-3:]))
    except Exception as exc:
        out.append(f"no Serve logs: {exc!r}")
    return "\n".join(out)


def test_cluster_ps_shows_every_node(setup: Setup) -> None:
    http = setup.url.removeprefix("http://")
    out = _cli("cluster", "ps", "--http", http, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kind"] == "cluster_ps" and doc["policy"] == "placement"
    held = {n["node"]: {m["name"] for m in n["models"]} for n in doc["nodes"]}
    assert held == {name: d.loaded() for name, d in setup.daemons.items()}
    assert all(n["up"] and n["budget_bytes"] > 0 for n in doc["nodes"])
    text = _cli("cluster", "ps", "--http", http)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("NODE") and "alpha" in text.stdout and "beta" in text.stdout
    wrong = _cli("cluster", "ps", "--http", http, "--policy", "round-robin")
    assert wrong.returncode == 2 and "--policy" in wrong.stderr


def test_errors_come_back_in_the_api_shape(setup: Setup) -> None:
    r = setup.http.post("/api/generate", json={"model": "nope", "prompt": "x"})
    assert r.status_code == 404 and "nope" in r.json()["error"]
    r = setup.http.post("/v1/chat/completions", json={"model": "a", "messages": "x"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = setup.http.get("/api/tags")
    assert r.status_code == 200
    assert {m["name"] for m in r.json()["models"]} >= {"a", "b", "c"}
    r = setup.http.post("/api/generate", json={"model": "a"}, headers={"Host": "evil.example"})
    assert r.status_code == 403


def _errors_of(lines: Iterator[str]) -> tuple[list[str], threading.Thread]:
    """Read a held stream to its end on a thread; the error events it carried."""
    errors: list[str] = []

    def drain() -> None:
        for line in lines:
            if line and "error" in json.loads(line):
                errors.append(json.loads(line)["error"])

    reader = threading.Thread(target=drain)
    reader.start()
    return errors, reader


def test_a_removed_node_costs_only_its_in_flight_requests(setup: Setup) -> None:
    # the model on the worker node's daemon (beta: the head node cannot be removed)
    (model,) = [m for m in ("a", "b") if setup.holder(m) == {"beta"}]
    resp, lines = _busy(setup, model)
    errors, reader = _errors_of(lines)
    setup.cluster.remove_node(setup.worker)
    reader.join(60)
    resp.close()
    assert errors and "lost" in errors[0]
    started = time.monotonic()
    setup.generate(model)  # served by the node left
    assert model in setup.daemons["alpha"].loaded()
    assert time.monotonic() - started < 30


def test_a_killed_daemon_costs_only_its_in_flight_requests(setup: Setup) -> None:
    """Last: alpha's daemon is killed under a stream (beta's node was removed before)."""
    (model,) = setup.daemons["alpha"].loaded()
    resp, lines = _busy(setup, model)
    errors, reader = _errors_of(lines)
    alpha = setup.daemons["alpha"]
    alpha.proc.kill()  # SIGKILL: its socket file stays, nothing tells the node it left
    alpha.proc.wait(10)
    reader.join(60)
    resp.close()
    assert errors and "lost" in errors[0] and "stopped answering" in errors[0]
    r = setup.http.post("/v1/chat/completions", json={  # no node answers: a typed 503
        "model": model, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "daemon_unavailable"

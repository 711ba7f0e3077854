"""The HTTP front door against hostile local processes (issue 45), on a real daemon:

- a flood of idle connections from many 127.x.y.z addresses cannot take the descriptors libzmq
  needs (it aborted the daemon in ``ipc_listener.cpp``): the excess is refused or the oldest
  idle connection closed, and ``ps``, new CLI connections and HTTP keep working;
- another local user (``nobody``, through ``setpriv``) is refused by default, deletes and pulls
  included; let in (``http_users = all``) it still cannot name a file, and its idle
  connections cannot crowd out the owner's upload;
- a path that is not a model is the same "unknown model" whether or not it exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemonutil import alive, until

Factory = Callable[..., Any]
NOBODY = 65534
#: The daemon's open-file limit in the flood test: its front door may hold (640 - 256 - 128)
#: / 4 = 64 connections (http/fds.py).
NOFILE = 640
FLOOD = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(daemon_factory: Factory, *flags: str, **kw: Any) -> tuple[Any, int]:
    port = _free_port()
    d = daemon_factory("--http", f"127.0.0.1:{port}", *flags, **kw)
    until(lambda: _answers(port), timeout=30, what="the HTTP front door")
    return d, port


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/version", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def _own_nofile(n: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _flood(port: int, n: int) -> list[socket.socket]:
    """``n`` connections that never send a byte, each from its own 127.x.y.z address (each
    connect waits for the handshake: a full accept queue drops SYNs, and the retried ones
    would trickle in for half a minute)."""
    out = []
    for i in range(n):
        s = socket.socket()
        s.bind((f"127.{1 + i // 250}.{i % 250}.{1 + i % 7}", 0))
        s.settimeout(30)
        s.connect(("127.0.0.1", port))
        s.setblocking(False)
        out.append(s)
    return out


def _answer(s: socket.socket) -> bytes | None:
    """What the daemon sent on ``s`` before closing it; None while it is still open."""
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except BlockingIOError:
        return None
    except OSError:
        return got or b"reset"
    return got or b"closed"


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_descriptor_flood_leaves_the_daemon_serving(daemon_factory: Factory) -> None:
    d, port = _start(daemon_factory, nofile=NOFILE,
                     env={"MODELD_HTTP_CLIENT_CONNECTIONS": "10000"})  # only the total cap
    assert "at most 64 connections" in d.log_text()
    with _own_nofile(FLOOD + 200):
        flood = _flood(port, FLOOD)
        try:
            # every connection accepted and looked at: the daemon holds at most its cap
            until(lambda: sum(_answer(s) is not None for s in flood) >= FLOOD - 64,
                  timeout=30, what="the excess connections closed")
            assert _fds(d.proc.pid) < NOFILE - 128
            for _ in range(5):  # new ZeroMQ connections (each a descriptor in the daemon)
                c = d.client()
                assert isinstance(c.ps(), list)
                c.close()
            r = httpx.get(f"http://127.0.0.1:{port}/api/tags", timeout=30)
            assert r.status_code == 200  # room made: an idle connection of the flood closed
            answered = [a for s in flood if (a := _answer(s)) not in (None, b"closed", b"reset")]
            assert answered and all(a.startswith(b"HTTP/1.1 503") for a in answered)
            assert b"too many HTTP connections" in answered[0]
        finally:
            for s in flood:
                s.close()
    assert alive(d.proc.pid) and d.proc.poll() is None
    assert d.client().ping()["pong"]
    assert "Too many open files" not in d.log_text() and "Traceback" not in d.log_text()


# ---------------------------------------------------------------------- another local user

NOBODY_SCRIPT = r"""
import json, socket, sys, time
port, plan = int(sys.argv[1]), json.loads(sys.argv[2])
out = []
held = []
for method, path, body in plan["requests"]:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    data = json.dumps(body).encode() if body is not None else b""
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
              f"\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except OSError:
        pass
    s.close()
    head, _, rest = got.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    out.append([status, rest.decode(errors="replace")])
for _ in range(plan.get("idle", 0)):
    held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
print(json.dumps(out), flush=True)
time.sleep(plan.get("hold_s", 0))
"""


def _as_nobody(port: int, requests: list[tuple[str, str, Any]], idle: int = 0,
               hold_s: float = 0.0) -> subprocess.Popen[str]:
    """A client process of user ``nobody`` (plain Python, no site packages)."""
    python = os.path.realpath(sys.executable)
    plan = json.dumps({"requests": requests, "idle": idle, "hold_s": hold_s})
    return subprocess.Popen(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY),
                             "--clear-groups", python, "-I", "-c", NOBODY_SCRIPT, str(port),
                             plan], stdout=subprocess.PIPE, text=True, cwd="/")


def _nobody(port: int, requests: list[tuple[str, str, Any]]) -> list[tuple[int, str]]:
    proc = _as_nobody(port, requests)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    return [(int(s), str(b)) for s, b in json.loads(out)]


needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="another local user needs root (setpriv --reuid) to be played")


@needs_root
def test_another_local_user_is_refused_by_default(daemon_factory: Factory,
                                                  tiny_chat_model: Path) -> None:
    d, port = _start(daemon_factory)
    models = d.root / "models"
    models.mkdir(exist_ok=True)
    (models / "tiny.gguf").write_bytes(tiny_chat_model.read_bytes())
    got = _nobody(port, [("GET", "/api/tags", None),
                         ("DELETE", "/api/delete", {"model": "tiny"}),
                         ("POST", "/api/pull", {"model": "hf.co/org/repo:Q4_K_M"}),
                         ("POST", "/api/show", {"model": "/etc/shadow"})])
    assert [s for s, _ in got] == [403, 403, 403, 403], got
    assert all("serves only the user running it" in b and "http_users" in b for _, b in got)
    assert (models / "tiny.gguf").exists()
    # the owner, with no configuration, is served as before
    tags = httpx.get(f"http://127.0.0.1:{port}/api/tags", timeout=30)
    assert tags.status_code == 200 and "tiny" in [m["name"] for m in tags.json()["models"]]
    assert d.proc.poll() is None


@needs_root
def test_with_http_users_key_another_user_needs_the_api_key(daemon_factory: Factory) -> None:
    port = _free_port()
    daemon_factory("--http", f"127.0.0.1:{port}",
                   env={"MODELD_HTTP_USERS": "key", "MODELD_API_KEY": "k3y"})
    until(lambda: _status(port, "Bearer k3y") == 200, timeout=30, what="the HTTP front door")
    assert _nobody_status(port, "") == 401
    assert _nobody_status(port, "bearer k3y") == 200  # the scheme's case is free
    assert _status(port, "") == 401  # the owner too, once a key is set (as before)


def _status(port: int, authorization: str) -> int:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/tags", timeout=5,
                         headers={"Authorization": authorization}).status_code
    except httpx.HTTPError:
        return 0


def _nobody_status(port: int, authorization: str) -> int:
    """The status ``nobody`` gets for ``GET /api/tags`` with this Authorization header."""
    script = ("import socket,sys; s=socket.create_connection(('127.0.0.1',int(sys.argv[1])),10);"
              "s.sendall(('GET /api/tags HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nAuthorization: '"
              "+sys.argv[2]+'\\r\\nConnection: close\\r\\n\\r\\n').encode());"
              "print(s.recv(64).split(b' ')[1].decode())")
    out = subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY),
                          "--clear-groups", os.path.realpath(sys.executable), "-I", "-c", script,
                          str(port), authorization], capture_output=True, text=True, timeout=30,
                         cwd="/")
    return int(out.stdout.strip() or 0)


@needs_root
def test_let_in_another_user_names_models_not_files_and_cannot_crowd_the_owner_out(
        daemon_factory: Factory) -> None:
    d, port = _start(daemon_factory, env={"MODELD_HTTP_USERS": "all",
                                          "MODELD_HTTP_CLIENT_CONNECTIONS": "8"})
    secret = d.root / "secret.gguf"
    secret.write_bytes(b"root:x:0:0 not a model")
    got = _nobody(port, [("POST", "/api/show", {"model": "/etc/shadow"}),
                         ("POST", "/api/show", {"model": str(secret)}),
                         ("POST", "/api/show", {"model": str(d.root / "missing.gguf")}),
                         ("POST", "/api/generate", {"model": "../../etc/passwd", "prompt": "x"}),
                         ("DELETE", "/api/delete", {"model": str(secret)})])
    assert [s for s, _ in got] == [404] * 5, got
    for _, body in got:  # one answer whether the file exists or not, and none of its bytes
        assert "takes model names, not file paths" in body and "root:" not in body
        assert "does not exist" not in body and "GGUF" not in body
    assert secret.exists()
    # the owner's upload is half sent when nobody opens 40 idle connections: over the cap of
    # 8, those crowd out nobody's own oldest, never the owner's (they were one 127.0.0.1)
    body = json.dumps({"model": "nope", "prompt": "x" * 1_600_000}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as owner:
        owner.sendall(b"POST /api/show HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                      b"application/json\r\nContent-Length: " + str(len(body)).encode()
                      + b"\r\n\r\n" + body[:800_000])
        crowd = _as_nobody(port, [], idle=40, hold_s=30)
        try:
            assert crowd.stdout is not None and crowd.stdout.readline().strip() == "[]"
            time.sleep(0.5)
            owner.sendall(body[800_000:])
            reply = b""
            while chunk := owner.recv(65536):
                reply += chunk
                if b"\r\n\r\n" in reply:
                    break
        finally:
            crowd.kill()
            crowd.wait(10)
    assert reply.startswith(b"HTTP/1.1 404"), reply[:300]  # "unknown model", not a 429
    assert d.proc.poll() is None


def test_a_path_over_http_is_an_unknown_model_unless_paths_are_allowed(
        daemon_factory: Factory, tiny_chat_model: Path) -> None:
    d, port = _start(daemon_factory)
    base = f"http://127.0.0.1:{port}"
    for name in (str(tiny_chat_model), "/etc/passwd", "/no/such/file.gguf", "./x.gguf"):
        r = httpx.post(f"{base}/api/show", json={"model": name}, timeout=30)
        assert r.status_code == 404, r.text
        assert "takes model names, not file paths" in r.json()["error"]
    r = httpx.post(f"{base}/v1/chat/completions", timeout=30, json={
        "model": str(tiny_chat_model), "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and "not file paths" in r.json()["error"]["message"]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:  # a 100 KB path
        raw.sendall(b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Connection: close\r\n\r\n")
        reply = b""
        while chunk := raw.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 404") and len(reply) < 2000, reply[:300]
    d.stop()
    d2, port2 = _start(daemon_factory, "--http-model-paths")
    shown = httpx.post(f"http://127.0.0.1:{port2}/api/show", timeout=60,
                       json={"model": str(tiny_chat_model)})
    assert shown.status_code == 200, shown.text
    assert d2.proc.poll() is None


def test_a_prompt_sized_from_its_bytes_is_counted_before_any_reload(
        daemon_factory: Factory, tiny_model: Path) -> None:
    """A prompt the runner refuses from its bytes (a lower bound of its tokens) that a larger
    context might hold is counted exactly by the runner it has, first: one that can never fit
    (over the training context) is refused without reloading the model; one that fits after
    all grows the context as before."""
    d, port = _start(daemon_factory, "--ctx-floor", "256", "--ctx-ceiling", "256",
                     "--parallel", "1")
    (d.root / "models").mkdir(exist_ok=True)
    (d.root / "models" / "tiny.gguf").write_bytes(tiny_model.read_bytes())
    base = f"http://127.0.0.1:{port}"

    def generate(prompt: str) -> httpx.Response:
        return httpx.post(f"{base}/api/generate", timeout=300, json={
            "model": "tiny", "prompt": prompt, "raw": True, "stream": False,
            "options": {"num_predict": 1, "temperature": 0}})

    assert generate("hi").status_code == 200
    never = generate("hello world " * 700)  # ~7,000 tokens, fewer by its bytes
    assert never.status_code == 400, never.text
    error = never.json()["error"]
    assert "trained for 2048" in error and "at least" not in error, error
    stats = d.client().stats()
    assert stats["loads"] == 1, stats  # no reload for a prompt that could never fit
    fits = generate("hello world " * 180)  # 2,160 bytes, ~1,800 tokens: over 256, under 2048
    assert fits.status_code == 200, fits.text
    assert fits.json()["prompt_eval_count"] > 256
    assert d.client().stats()["loads"] == 2  # the one reload it needed
    log = (d.log_dir / "modeld.log").read_text()
    assert log.count("counted before a reload") == 2  # both were sized from their bytes


def test_a_prompt_its_bytes_prove_too_long_is_refused_without_its_runner(
        daemon_factory: Factory, tiny_model: Path) -> None:
    """The daemon refuses a prompt whose bytes prove it over the training context before it
    waits for a sequence: here the model's one runner is stopped (SIGSTOP), and the answer
    still comes, from the daemon (a 5 MB prompt waited 122 s behind a stream for it)."""
    import signal

    d, port = _start(daemon_factory, "--parallel", "1", "--runner-stall", "60")
    (d.root / "models").mkdir(exist_ok=True)
    (d.root / "models" / "tiny.gguf").write_bytes(tiny_model.read_bytes())
    base = f"http://127.0.0.1:{port}"
    body = {"model": "tiny", "raw": True, "stream": False, "options": {"num_predict": 1}}
    assert httpx.post(f"{base}/api/generate", json={**body, "prompt": "hi"},
                      timeout=120).status_code == 200
    runner = next(r["runner_pid"] for r in d.client().ps() if r["state"] == "ready")
    os.kill(runner, signal.SIGSTOP)
    try:
        r = httpx.post(f"{base}/api/generate", timeout=30, json={
            **body, "prompt": "hello world " * 20_000})  # 240 KB: >= 40,000 tokens, 2,048 fit
        assert r.status_code == 400, r.text
        assert "at least" in r.json()["error"] and "trained for 2048" in r.json()["error"]
        r = httpx.post(f"{base}/v1/chat/completions", timeout=30, json={
            "model": "tiny", "max_tokens": 1, "messages": [
                {"role": "user", "content": "hello world " * 20_000}]})
        assert r.status_code == 400 and "trained for 2048" in r.text, r.text
    finally:
        os.kill(runner, signal.SIGCONT)
    assert d.client().stats()["runner_stalls"] == 0
    # count_tokens is not refused by the generate rule: past the context it is still counted
    # (24 KB: >= 4,000 tokens), up to the count_tokens bound (4 training contexts, from its
    # bytes: the 240 KB prompt is refused there, naming the training context)
    counted = httpx.post(f"{base}/v1/messages/count_tokens", timeout=120, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hello world " * 2_000}]})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 2048, counted.text
    refused = httpx.post(f"{base}/v1/messages/count_tokens", timeout=120, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hello world " * 20_000}]})
    assert refused.status_code == 400 and "2048" in refused.text, refused.text

"""The chaos run's hostile requests (issue 35: a hub that lies, ports that are no RPC workers,
tool results that answer no call, slow clients; issue 45: a flood of idle connections, another
local user, an 8 MB enum, tool-call arguments 5,000 deep, a 12 MB count_tokens), in bounded
counts on a thread of their own.

Each request must get its typed error (a lying listing 502, an orphan tool result 400, a port
that is no worker ``rpc_worker``, a slow request head 408 at its limit, the flood's excess
answered and closed while ``ps`` and HTTP go on answering, another user 403); anything else
is counted ``untyped`` (lost). Afterwards nothing outside the models dir changed (a victim
folder the lying listing points at) and no pull left a lock file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import ROOT, target

sys.path.insert(0, str(ROOT / "tests"))

from fakehub import FakeHub, HubFile

#: Daemon flags: short limits on request heads and bodies, so a slow client is cut in 2 s.
ARGS = ("--http-header-timeout", "2", "--http-body-timeout", "2")
HEADER_LIMIT_S = 2.0
PERIOD_S = 2.0  # one hostile request this often
MAX_EACH = 8  # and at most this many of each kind
SLOW_CONNS = 8
#: Idle connections of one descriptor flood (the issue's count: past the daemon's 1,024
#: connections), from as many 127.x.y.z addresses; at most FLOODS floods a run.
FLOOD = 1100
FLOODS = 2
NOBODY = 65534


class Hostile:
    """The fake hub with a lying repository, a victim folder, and the request loop."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="mdhostile-"))
        self.victim = self.root / "outside"
        self.victim.mkdir()
        (self.victim / "victim.part").write_bytes(b"precious")
        self.hub = FakeHub()
        self.counts: dict[str, int] = {}
        self.slow_held: list[float] = []
        self.floods: list[dict[str, float]] = []

    def __enter__(self) -> Hostile:
        self.hub.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hub.__exit__(*exc)
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def env(self) -> dict[str, str]:
        return {"HF_ENDPOINT": self.hub.url, "HF_HOME": str(self.root / "hf")}

    def prepare(self, d: Any) -> None:
        """The lying listing points from the daemon's ``.partial/`` at the victim."""
        partial = d.root / "data" / "modeld" / "models" / ".partial"
        rel = os.path.relpath(self.victim / "victim", partial)
        data = b"GGUF" + bytes(range(256)) * 8
        self.hub.add("evil/lie", {"m-Q4_K_M.gguf": HubFile(data=data,
                                                           listed={"lfs": {"oid": rel}})})
        self.hub.add("evil/nul", {"m-Q4_K_M\0.gguf": HubFile(data=data)})
        self.before = _snapshot(self.victim)

    def warm(self, http_port: int) -> None:
        """One lying pull before the run's descriptors are counted: huggingface_hub keeps a
        pooled connection to the hub open in the daemon from its first listing on."""
        import httpx

        httpx.post(f"http://127.0.0.1:{http_port}/api/pull", timeout=60,
                   json={"model": "hf.co/evil/lie:Q4_K_M", "stream": False})

    def loop(self, d: Any, tally: Any, stop: float, model: str, http_port: int) -> None:
        kinds = ("h35_pull_lie", "h35_orphan_tool", "h35_slow_head", "h35_rpc_not_worker",
                 "h45_fd_flood", *(("h45_other_user",) if _can_be_nobody() else ()),
                 "h45_enum_8mb", "h45_deep_arguments", "h45_count_12mb")
        most = {"h45_fd_flood": FLOODS}
        i = 0
        c = d.client(timeout=60.0)
        try:
            while time.monotonic() < stop:
                op = kinds[i % len(kinds)]
                i += 1
                if self.counts.get(op, 0) >= most.get(op, MAX_EACH):
                    if all(self.counts.get(k, 0) >= most.get(k, MAX_EACH) for k in kinds):
                        return
                    continue
                self.counts[op] = self.counts.get(op, 0) + 1
                try:
                    tally.add(op, self._one(op, d, c, model, http_port))
                except Exception as exc:
                    tally.add(op, "untyped", f"{type(exc).__name__}: {exc}")
                time.sleep(PERIOD_S)
        finally:
            c.close()

    def _one(self, op: str, d: Any, c: Any, model: str, http_port: int) -> str:
        import httpx

        from modeld.errors import ModeldError

        base = f"http://127.0.0.1:{http_port}"
        if op == "h35_pull_lie":
            repo = "evil/lie" if self.counts[op] % 2 else "evil/nul"
            r = httpx.post(f"{base}/api/pull", json={"model": f"hf.co/{repo}:Q4_K_M",
                                                     "stream": False}, timeout=60)
            if r.status_code != 502 or "not valid" not in r.text:
                return f"untyped:{r.status_code}"
            return "error:verification_failed"
        if op == "h35_orphan_tool":
            r = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
                "model": model, "max_tokens": 2, "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "tool", "tool_call_id": "call_x", "content": "42"}]})
            ok = r.status_code == 400 and "answers no tool call" in r.text
            return "error:invalid_request" if ok else f"untyped:{r.status_code}"
        if op == "h35_slow_head":
            held = _slow_heads(http_port, SLOW_CONNS)
            self.slow_held += held
            late = [h for h in held if h > HEADER_LIMIT_S + 3.0]
            return "error:timeout" if len(held) == SLOW_CONNS and not late else \
                f"untyped:slow heads held {max(held, default=-1):.1f} s"  # fmt: skip
        if op == "h45_fd_flood":
            flood = _fd_flood(d, http_port)
            self.floods.append(flood)
            ok = flood["refused"] > 0 and flood["ps_ok"] and flood["http_ok"]
            return "error:full" if ok else f"untyped:flood {flood}"
        if op == "h45_other_user":
            status = _as_nobody(http_port)
            return "error:forbidden" if status == 403 else f"untyped:{status}"
        if op.startswith("h45_"):
            return _heavy(op, base, model)
        try:  # the daemon's own HTTP port accepts TCP and is no worker
            c.load(model, rpc=[f"127.0.0.1:{http_port}"])
            return "untyped:a port that is no worker was accepted"
        except ModeldError as exc:
            return f"error:{exc.code.value}"

    def summary(self) -> dict[str, Any]:
        return {"hostile": {"requests": dict(self.counts),
                            "victim_unchanged": _snapshot(self.victim) == self.before,
                            "slow_heads": len(self.slow_held),
                            "slow_head_max_s": max(self.slow_held, default=None),
                            "fd_floods": self.floods}}

    def locks_left(self, d: Any) -> int:
        return len(list((d.root / "data" / "modeld" / "models").rglob("*.lock")))

    def targets(self, d: Any) -> list[dict[str, Any]]:
        changed = 0 if _snapshot(self.victim) == self.before else 1
        failed = sum(not (f["ps_ok"] and f["http_ok"]) for f in self.floods)
        return [target("hostile hub: files outside the models dir changed, + lock files left",
                       changed + self.locks_left(d), 0, "<="),
                target("slow request head held (s), max", max(self.slow_held, default=0.0),
                       HEADER_LIMIT_S + 3.0, "<="),
                target("descriptor flood: ps or an HTTP request failed during it", failed, 0,
                       "<=")]  # fmt: skip


#: Issue 45's heavy requests: each must be a 400 saying why, before the heavy work.
_ENUM = {"enum": [f"w{i:010d}" for i in range(700_000)]}  # 8.4 MB of JSON
_DEEP = "[" * 5_000 + "]" * 5_000


def _heavy(op: str, base: str, model: str) -> str:
    import httpx

    ask = [{"role": "user", "content": "hi"}]
    if op == "h45_enum_8mb":
        route, body, says = "/api/chat", {"model": model, "messages": ask, "stream": False,
                                          "format": _ENUM}, "enum/const values"
    elif op == "h45_deep_arguments":
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": _DEEP}}
        route, body, says = "/v1/chat/completions", {"model": model, "max_tokens": 2, "messages": [
            *ask, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}, "nests deeper"
    else:
        route, body, says = "/v1/messages/count_tokens", {"model": model, "messages": [
            {"role": "user", "content": "hello world " * 1_050_000}]}, "was trained for"
    r = httpx.post(f"{base}{route}", json=body, timeout=120)
    return "error:invalid_request" if r.status_code == 400 and says in r.text else \
        f"untyped:{r.status_code}"  # fmt: skip


def _slow_heads(port: int, n: int) -> list[float]:
    """Open ``n`` connections that send a request head a byte every 0.25 s; seconds each was
    held before the daemon answered and closed it (a 408 expected)."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setblocking(False)
        socks.append([s, time.monotonic(), None, b""])
    head = b"GET /api/tags HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 100
    end = time.monotonic() + HEADER_LIMIT_S + 10
    sent = 0
    while time.monotonic() < end and any(e[2] is None for e in socks):
        for e in socks:
            if e[2] is not None:
                continue
            try:
                while chunk := e[0].recv(4096):
                    e[3] += chunk
                e[2] = time.monotonic()
            except BlockingIOError:
                try:
                    e[0].send(head[sent:sent + 1])
                except OSError:
                    e[2] = time.monotonic()
            except OSError:
                e[2] = time.monotonic()
        sent = min(sent + 1, len(head) - 1)
        time.sleep(0.25)
    held = []
    for s, opened, closed, reply in socks:
        s.close()
        if closed is not None and reply.startswith(b"HTTP/1.1 408"):
            held.append(closed - opened)
    return held


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}  # fmt: skip


def _fd_flood(d: Any, port: int) -> dict[str, Any]:
    """:data:`FLOOD` idle connections from as many 127.x.y.z addresses, held while a new CLI
    connection asks ``ps`` and an HTTP request is made (it aborted in libzmq before). One local
    user's: its excess is crowded out (429), cut at the head's time limit (408) or past the
    daemon's connection cap refused (503); ``refused`` counts those answered."""
    import resource

    import httpx

    from modeld.client import Client

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FLOOD + 256 if hard == resource.RLIM_INFINITY else min(FLOOD + 256, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    socks: list[socket.socket] = []
    out: dict[str, Any] = {"connections": 0, "refused": 0, "ps_ok": False, "http_ok": False}
    try:
        t0 = time.monotonic()
        for i in range(min(FLOOD, want - 128)):
            s = socket.socket()
            socks.append(s)
            s.bind((f"127.{1 + i // 250}.{i % 250}.{1 + i % 7}", 0))
            s.settimeout(10)
            s.connect(("127.0.0.1", port))
            s.setblocking(False)
        out.update(connections=len(socks), connect_s=round(time.monotonic() - t0, 2),
                   daemon_fds=len(os.listdir(f"/proc/{d.pid}/fd")))
        t0 = time.monotonic()
        with Client(d.endpoint, timeout=30.0, connect_timeout=10.0) as c:
            out["ps_ok"] = isinstance(c.ps(), list)
        out["ps_s"] = round(time.monotonic() - t0, 3)
        t0 = time.monotonic()
        out["http_ok"] = httpx.get(f"http://127.0.0.1:{port}/api/tags",
                                   timeout=30).status_code == 200
        out["http_s"] = round(time.monotonic() - t0, 3)
        for s in socks:
            with contextlib.suppress(OSError):
                out["refused"] += s.recv(16, socket.MSG_PEEK).startswith(b"HTTP/1.1 ")
    except Exception as exc:  # the daemon gone, a refused connect: this flood's outcome
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return out


def _can_be_nobody() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv") is not None


def _as_nobody(port: int) -> int:
    """The status user ``nobody`` gets for ``GET /api/tags`` (the default: 403)."""
    import subprocess

    script = ("import socket,sys; s=socket.create_connection(('127.0.0.1',int(sys.argv[1])),10);"
              "s.sendall(b'GET /api/tags HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nConnection: close"
              "\\r\\n\\r\\n'); print(s.recv(64).split(b' ')[1].decode())")
    out = subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY),
                          "--clear-groups", os.path.realpath(sys.executable), "-I", "-c", script,
                          str(port)], capture_output=True, text=True, timeout=30, cwd="/")
    return int(out.stdout.strip() or 0)

"""The chaos run's hostile requests (issue 35: a hub that lies, ports that are no RPC workers,
tool results that answer no call, slow clients; issue 45: an 8 MB enum, tool-call arguments
5,000 deep, a 12 MB count_tokens), in bounded counts on a thread of their own.

Each request must get its typed error (a lying listing 502, an orphan tool result 400, a port
that is no worker ``rpc_worker``, a slow request head 408 at its limit); anything else is
counted ``untyped`` (lost). Afterwards nothing outside the models dir changed (a victim folder
the lying listing points at) and no pull left a lock file.
"""

from __future__ import annotations

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
                 "h45_enum_8mb", "h45_deep_arguments", "h45_count_12mb")
        i = 0
        c = d.client(timeout=60.0)
        try:
            while time.monotonic() < stop:
                op = kinds[i % len(kinds)]
                i += 1
                if self.counts.get(op, 0) >= MAX_EACH:
                    if all(self.counts.get(k, 0) >= MAX_EACH for k in kinds):
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
                            "slow_head_max_s": max(self.slow_held, default=None)}}

    def locks_left(self, d: Any) -> int:
        return len(list((d.root / "data" / "modeld" / "models").rglob("*.lock")))

    def targets(self, d: Any) -> list[dict[str, Any]]:
        changed = 0 if _snapshot(self.victim) == self.before else 1
        return [target("hostile hub: files outside the models dir changed, + lock files left",
                       changed + self.locks_left(d), 0, "<="),
                target("slow request head held (s), max", max(self.slow_held, default=0.0),
                       HEADER_LIMIT_S + 3.0, "<=")]  # fmt: skip


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

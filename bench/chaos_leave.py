"""The chaos run's issue-21 part: callers that leave, and text that cannot be encoded.

Leave trials, on a daemon of their own with HTTP and the real default model (gemma-3-270m,
whose ~9,700-token prompt takes tens of seconds to evaluate here): each trial starts a request
with that prompt, waits until it is being evaluated, then leaves one way (an HTTP stream whose
socket closes before its first token, a non-streaming HTTP request whose client times out, a
CLI killed with SIGKILL) and times how long until the daemon has nothing in flight (the runner
idle). Between trials a stream runs while requests holding a lone surrogate go to every route:
each must be a 400 and the stream must end normally. Afterwards every model's in-flight and
queued counts must be 0 (no wedged model).

    .venv/bin/python bench/chaos.py          # runs these after the chaos run
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
from typing import Any

import httpx
from harness import BIN, daemon, free_port, summary

#: About 9,700 tokens for gemma-3-270m: tens of seconds of prompt evaluation on 2 cores.
LONG_PROMPT = " ".join(f"item{i} is on the list" for i in range(1200))
IDLE_DEADLINE_S = 60.0  # past this a trial counts as wedged
BAD = '"x\\ud83d"'
BAD_TEXT = [("/api/generate", '{"model": "default", "prompt": %s}'),
            ("/api/chat", '{"model": "default", "messages": [{"role": "user", "content": %s}]}'),
            ("/api/embed", '{"model": "default", "input": [%s]}'),
            ("/v1/chat/completions",
             '{"model": "default", "messages": [{"role": "user", "content": %s}]}'),
            ("/v1/completions", '{"model": "default", "prompt": %s}'),
            ("/v1/embeddings", '{"model": "default", "input": %s}')]


def _in_flight(c: Any) -> int:
    return int(c.stats()["in_flight"])


def _wait(cond: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


class Trials:
    def __init__(self, d: Any, port: int) -> None:
        self.d, self.port = d, port
        self.base = f"http://127.0.0.1:{port}"
        self.c = d.client(timeout=600.0)

    def leave(self, kind: str) -> float | None:
        """Start one request of ``kind``, leave during its prompt, the seconds until idle
        (None: not idle within IDLE_DEADLINE_S, a wedged model)."""
        body = {"model": "default", "prompt": LONG_PROMPT, "options": {"num_predict": 2000}}
        if kind == "http_stream":
            data = json.dumps(body).encode()
            sock = socket.create_connection(("127.0.0.1", self.port))
            sock.sendall(b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                         b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
            go = sock.close
        elif kind == "http_nonstream":
            done = threading.Event()

            def call() -> None:
                with contextlib.suppress(httpx.HTTPError):  # the client's own timeout: it
                    httpx.post(f"{self.base}/api/generate",  # gives up, closing the socket
                               json={**body, "stream": False}, timeout=httpx.Timeout(1.5))
                done.set()

            threading.Thread(target=call, daemon=True).start()
            go = lambda: done.wait(30)  # noqa: E731 - the timeout fires at 1.5 s
        else:  # cli_sigkill
            proc = subprocess.Popen([str(BIN / "modeld"), "run", "default", "Summarise:"],
                                    env=self.d.env, stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            assert proc.stdin is not None
            proc.stdin.write(LONG_PROMPT.encode())
            proc.stdin.close()

            def go() -> None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)

        if not _wait(lambda: _in_flight(self.c) >= 1, 60):
            return None
        time.sleep(0.8)  # well inside the prompt's evaluation
        go()
        t0 = time.monotonic()
        if not _wait(lambda: _in_flight(self.c) == 0, IDLE_DEADLINE_S):
            return None
        return time.monotonic() - t0

    def bad_text_beside_a_stream(self) -> tuple[int, int, bool]:
        """(400s, other answers, the stream beside them ended normally)."""
        lines: list[dict[str, Any]] = []
        body = {"model": "default", "prompt": "Once upon a time", "raw": True,
                "options": {"num_predict": 200, "temperature": 0}}

        def stream() -> None:
            with httpx.stream("POST", f"{self.base}/api/generate", json=body,
                              timeout=120) as r:
                lines.extend(json.loads(x) for x in r.iter_lines() if x)

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        _wait(lambda: _in_flight(self.c) >= 1, 60)
        ok = other = 0
        for route, template in BAD_TEXT:
            r = httpx.post(f"{self.base}{route}", content=template % BAD, timeout=60)
            ok, other = (ok + 1, other) if r.status_code == 400 else (ok, other + 1)
        t.join(120)
        fine = bool(lines) and lines[-1].get("done") is True and not any(
            "error" in x for x in lines)
        return ok, other, fine


def leave_trials(rounds: int) -> dict[str, Any]:
    port = free_port()
    kinds = ("http_stream", "http_nonstream", "cli_sigkill")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    wedged = 0
    bad = {"sent": 0, "answered_400": 0, "other": 0, "streams_beside_ok": 0, "streams": 0}
    with daemon("--http", f"127.0.0.1:{port}") as d:
        t = Trials(d, port)
        harness_c = t.c
        harness_c.load(None, n_ctx=12288)  # the long prompt fits: no reload in a trial
        for _ in range(rounds):
            for kind in kinds:
                took = t.leave(kind)
                if took is None:
                    wedged += 1
                else:
                    times[kind].append(took)
            ok, other, fine = t.bad_text_beside_a_stream()
            bad["sent"] += ok + other
            bad["answered_400"] += ok
            bad["other"] += other
            bad["streams"] += 1
            bad["streams_beside_ok"] += fine
        _wait(lambda: _in_flight(harness_c) == 0, 30)
        stuck = [r["name"] for r in harness_c.ps() if r.get("in_flight") or r.get("queued")]
    every = [x for xs in times.values() for x in xs]
    return {
        "disconnect_to_idle_s": {k: summary(v) for k, v in times.items()},
        "disconnect_to_idle_all_s": summary(every),
        "leave_trials": rounds * len(kinds), "leave_wedged": wedged,
        "leave_wedged_models": stuck, "bad_text": bad,
    }

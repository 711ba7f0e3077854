"""A caller that leaves stops its work (issue 21, item 3), for every way it can leave: a
non-streaming HTTP client that disconnects, a streaming one that disconnects during prompt
evaluation (before its first token), and a CLI killed with SIGKILL mid-prompt.

A long prompt on the real default model (gemma-3-270m) takes tens of seconds to evaluate on
this machine class; each test requires the model's in-flight count to return to 0 within a
bound far shorter than that (a hang detector, not a speed assertion: bench/chaos.py measures
the time).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import test_http
from daemonutil import until
from test_http import Served

served = test_http.served

#: About 9,700 tokens for gemma: tens of seconds of prompt evaluation here, far past IDLE_WITHIN_S.
LONG_PROMPT = " ".join(f"item{i} is on the list" for i in range(1200))
IDLE_WITHIN_S = 10.0


def _in_flight(s: Served) -> int:
    return int(s.stats()["in_flight"])


def _evaluating(s: Served) -> bool:
    return any(r.get("in_flight") for r in s.d.client().ps())


def _leave_and_wait_idle(s: Served, leave: Any) -> float:
    until(lambda: _evaluating(s), timeout=60, what="the request to reach the runner")
    time.sleep(0.5)  # inside prompt evaluation now
    t0 = time.monotonic()
    leave()
    until(lambda: _in_flight(s) == 0, timeout=IDLE_WITHIN_S, what="the runner to go idle",
          show=lambda: s.d.client().ps())
    return time.monotonic() - t0


def _warm(s: Served) -> None:
    s.d.client().load(None, n_ctx=12288)  # the long prompt fits: no reload meanwhile


@pytest.mark.parametrize("route", ["/api/generate", "/v1/completions"])
def test_a_non_streaming_client_that_disconnects(
    served: Served, default_model: Path, route: str
) -> None:
    _warm(served)
    body: dict[str, Any] = {"model": "default", "prompt": LONG_PROMPT, "stream": False}
    body.update({"options": {"num_predict": 2000}} if route.startswith("/api")
                else {"max_tokens": 2000})
    failed: list[BaseException] = []

    def call() -> None:
        try:
            httpx.post(f"{served.base}{route}", json=body, timeout=httpx.Timeout(3.0))
        except httpx.TimeoutException as exc:  # the client gives up and closes the connection
            failed.append(exc)

    t = threading.Thread(target=call)
    t.start()
    _leave_and_wait_idle(served, lambda: t.join(30))
    assert failed, "the request was expected to time out on the client side"
    before = served.stats()["tokens_generated"]
    time.sleep(1.0)
    assert served.stats()["tokens_generated"] == before  # nothing runs on


def test_a_streaming_client_that_disconnects_during_prompt_evaluation(
    served: Served, default_model: Path
) -> None:
    _warm(served)
    body = json.dumps({"model": "default", "prompt": LONG_PROMPT,
                       "options": {"num_predict": 2000}}).encode()
    sock = socket.create_connection(("127.0.0.1", served.port))
    sock.sendall(b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    _leave_and_wait_idle(served, sock.close)  # no reply yet: its prompt is being evaluated


def test_a_cli_killed_with_sigkill_during_prompt_evaluation(
    served: Served, default_model: Path
) -> None:
    _warm(served)
    modeld = str(Path(sys.executable).parent / "modeld")
    proc = subprocess.Popen([modeld, "run", "default", "Summarise:"], env=served.d.env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    assert proc.stdin is not None
    proc.stdin.write(LONG_PROMPT.encode())
    proc.stdin.close()

    def leave() -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    _leave_and_wait_idle(served, leave)


def test_the_openai_clients_timeout_and_retries_leave_nothing_running(
    served: Served, default_model: Path
) -> None:
    """The official client with a timeout and two retries: three requests, each abandoned
    mid-prompt; none may run on (they filled every slot before)."""
    import openai

    _warm(served)
    before = served.stats()["requests"]
    client = openai.OpenAI(base_url=f"{served.base}/v1", api_key="x", timeout=2.0,
                           max_retries=2)
    with pytest.raises(openai.APITimeoutError):
        client.completions.create(model="default", prompt=LONG_PROMPT, max_tokens=2000)
    until(lambda: _in_flight(served) == 0, timeout=IDLE_WITHIN_S, what="nothing in flight",
          show=lambda: served.d.client().ps())
    assert served.stats()["requests"] == before + 3  # the first try and two retries

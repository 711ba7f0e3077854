"""The first-byte rule on all four HTTP APIs (issue 37), against a real daemon and runners: an
error before a stream's first byte is an HTTP status in the API's shape (an unknown model is a
404, not a 200 stream carrying an error); one after it (its runner killed mid-reply) is an error
in the stream, the API's way, and ends it. One rule, in ``modeld.http.reply``."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from daemonutil import until
from test_http import Served, start_served

Factory = Callable[..., Any]
ASK = [{"role": "user", "content": "Count on and on."}]
LONG = 1500  # tokens: a reply still running when its runner is killed

#: api -> (route, streamed body without its model, is the line a reply's first chunk)
CASES: dict[str, tuple[str, dict[str, Any], Callable[[str], bool]]] = {
    "ollama": ("/api/chat", {"messages": ASK, "options": {"num_predict": LONG,
                                                          "temperature": 0}},
               lambda line: '"content":"' in line and '"content":""' not in line),
    "openai": ("/v1/chat/completions", {"messages": ASK, "max_tokens": LONG, "stream": True,
                                        "temperature": 0},
               lambda line: line.startswith("data: {") and '"content":"' in line),
    "anthropic": ("/v1/messages", {"messages": ASK, "max_tokens": LONG, "stream": True,
                                   "temperature": 0},
                  lambda line: line == "event: content_block_delta"),
    "responses": ("/v1/responses", {"input": "Count on and on.", "max_output_tokens": LONG,
                                    "stream": True, "temperature": 0},
                  lambda line: line == "event: response.output_text.delta"),
}


def _before(s: Served, api: str) -> None:
    route, body, _ = CASES[api]
    r = httpx.post(f"{s.base}{route}", json={**body, "model": "no-such-model"}, timeout=60)
    assert r.status_code == 404, (api, r.status_code, r.text)
    doc = r.json()  # the API's own error shape, not a stream
    if api == "ollama":
        assert "modeld list" in doc["error"], doc
    elif api == "anthropic":
        assert doc["type"] == "error" and doc["error"]["type"] == "not_found_error", doc
    else:
        assert doc["error"]["code"] == "model_not_found", doc


def _after(s: Served, api: str) -> list[str]:
    """The stream's lines, its runner killed once its first chunk came."""
    route, body, first = CASES[api]
    lines: list[str] = []
    with httpx.stream("POST", f"{s.base}{route}", json={**body, "model": "tiny"},
                      timeout=120) as r:
        assert r.status_code == 200, (api, r.status_code)
        for line in r.iter_lines():
            lines.append(line)
            if first(line) and not any(first(x) for x in lines[:-1]):
                pids = [int(row["runner_pid"]) for row in s.d.client().ps()
                        if row.get("runner_pid")]
                assert len(pids) == 1, pids
                os.kill(pids[0], signal.SIGKILL)
    return [x for x in lines if x]


def test_an_error_before_the_first_byte_is_a_status_after_it_an_event(
    daemon_factory: Factory, tiny_chat_model: Path
) -> None:
    s = start_served(daemon_factory, tiny_chat_model)
    for api in CASES:
        _before(s, api)
        s.d.client().load("tiny", parallel=1)
        lines = _after(s, api)
        if api == "ollama":
            last = json.loads(lines[-1])
            assert set(last) == {"error"}, lines[-3:]
            assert not any('"done":true' in x for x in lines), lines[-3:]
        elif api == "openai":
            assert lines[-1] == "data: [DONE]", lines[-3:]
            err = json.loads(lines[-2].removeprefix("data: "))
            assert err["error"]["code"] == "runner_crashed", err
        else:
            assert lines[-2] == "event: error", (api, lines[-3:])
            err = json.loads(lines[-1].removeprefix("data: "))
            assert err["type"] == "error", err
            if api == "anthropic":
                assert err["error"]["type"] == "api_error", err
            else:
                assert err["code"] == "runner_crashed", err
        until(lambda: s.stats()["in_flight"] == 0, timeout=60, what="nothing in flight")

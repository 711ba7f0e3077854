"""Issue 21 against a real daemon behind the HTTP front door: one bad request never touches
another, and the rebinding guard parses what it checks."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

import test_http
from daemonutil import until
from test_http import Served

served = test_http.served  # the fixture: a daemon with HTTP, the tiny chat model as ``tiny``

SURROGATE = '"x\\ud83d"'  # valid JSON, no UTF-8 form
#: (route, body with the bad text, the field the 400 must name)
BAD_TEXT = [
    ("/api/generate", '{"model": "tiny", "prompt": %s}', "prompt"),
    ("/api/chat", '{"model": "tiny", "messages": [{"role": "user", "content": %s}]}',
     "messages[0].content"),
    ("/api/embed", '{"model": "tiny", "input": [%s]}', "input[0]"),
    ("/v1/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": %s}]}',
     "messages[0].content"),
    ("/v1/completions", '{"model": "tiny", "prompt": %s}', "prompt"),
    ("/v1/embeddings", '{"model": "tiny", "input": %s}', "input"),
    ("/v1/rerank", '{"model": "tiny", "query": "q", "documents": [%s]}', "documents[0]"),
    ("/api/show", '{"model": %s}', "model"),
]


def _in_flight(s: Served) -> int:
    return int(s.stats()["in_flight"])


def test_a_lone_surrogate_is_a_400_and_touches_no_other_stream(served: Served) -> None:
    """Item 1: while a stream runs on the model, each API's request carrying ``\\ud83d`` gets
    a 400 naming the field; the stream ends normally and nothing stays in flight."""
    lines: list[dict[str, Any]] = []

    def stream() -> None:
        body = {"model": "tiny", "prompt": "once upon a time", "raw": True,
                "options": {"num_predict": 400, "temperature": 0}}
        with httpx.stream("POST", f"{served.base}/api/generate", json=body, timeout=120) as r:
            lines.extend(json.loads(line) for line in r.iter_lines() if line)

    t = threading.Thread(target=stream)
    t.start()
    until(lambda: _in_flight(served) >= 1, timeout=60, what="the stream to start")
    for route, template, field in BAD_TEXT:
        r = httpx.post(f"{served.base}{route}", content=template % SURROGATE, timeout=30)
        assert r.status_code == 400, (route, r.status_code, r.text)
        assert field in r.text and "\\\\ud83d" in r.text, (route, r.text)
    t.join(120)
    assert not t.is_alive()
    assert lines and lines[-1]["done"] is True and lines[-1]["eval_count"] == 400, lines[-1:]
    assert not any("error" in line for line in lines)
    until(lambda: _in_flight(served) == 0, timeout=15, what="nothing in flight")
    ok = httpx.post(f"{served.base}/api/generate", timeout=60, json={
        "model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 3}})
    assert ok.status_code == 200 and ok.json()["eval_count"] == 3


def test_a_lone_surrogate_on_the_daemon_socket(served: Served) -> None:
    """The daemon's own protocol refuses it too (invalid_request naming the field)."""
    from modeld.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match=r"messages\[0\]\.content"):
        "".join(served.d.client().chat("tiny", [{"role": "user", "content": "a\udc80"}]))


@pytest.mark.parametrize(("host", "origin", "status"), [
    ("127.0.0.1.evil.com:{port}", None, 403),
    ("127.0.0.1.evil.com:{port}", "http://127.0.0.1.evil.com:{port}", 403),
    ("127.evil.com", None, 403),
    ("localhost.evil.com", None, 403),
    ("127.0.0.1:{port}", "http://127.0.0.1.evil.com:{port}", 403),
    ("127.0.0.1:{port}", "http://localhost.evil.com", 403),
    ("127.0.0.1:notaport", None, 403),
    ("127.0.0.1@evil.com", None, 403),
    ("", None, 403),
    ("127.0.0.1:{port}", None, 200),
    ("127.1.2.3", None, 200),
    ("localhost", "http://localhost:3000", 200),
    ("LOCALHOST:{port}", "http://127.0.0.1:{port}", 200),
    ("[::1]:{port}", "http://[::1]:8080", 200),
])
def test_the_rebinding_guard_parses_host_and_origin(
    served: Served, host: str, origin: str | None, status: int
) -> None:
    """Item 2: loopback is decided by parsing (an IP literal, ``localhost``), never by prefix."""
    headers = {"Host": host.format(port=served.port)}
    if origin is not None:
        headers["Origin"] = origin.format(port=served.port)
    r = httpx.get(f"{served.base}/api/tags", headers=headers, timeout=30)
    assert r.status_code == status, (headers, r.status_code, r.text)


def test_the_default_model_unloads_under_every_name(served: Served, default_model: Any) -> None:
    """Item 4: ``default``, the name ``ps`` shows, on the CLI, the daemon socket and Ollama's
    ``keep_alive: 0``; a name that is not loaded says what is."""
    import subprocess
    import sys
    from pathlib import Path

    c = served.d.client()
    shown = default_model.stem  # gemma-3-270m-q4_k_m: what ps and /api/ps show
    modeld = str(Path(sys.executable).parent / "modeld")

    def loaded() -> set[str]:
        return {r["name"] for r in c.ps() if r["state"] in ("ready", "loading")}

    def load() -> None:
        c.load(None)
        assert shown in loaded()
        assert [m["name"] for m in httpx.get(f"{served.base}/api/ps").json()["models"]] == [shown]

    for name in ("default", shown):
        load()
        cli = subprocess.run([modeld, "unload", name], env=served.d.env, capture_output=True,
                             text=True, timeout=60)
        assert cli.returncode == 0, (name, cli.stderr)
        until(lambda: shown not in loaded(), timeout=30, what=f"unload {name} (CLI)")
        load()
        r = httpx.post(f"{served.base}/api/generate", json={"model": name, "keep_alive": 0},
                       timeout=60)
        assert r.status_code == 200 and r.json()["done_reason"] == "unload", r.text
        until(lambda: shown not in loaded(), timeout=30, what=f"unload {name} (Ollama)")
    load()
    assert c.unload(shown)["unloaded"] == [shown]  # the daemon's own protocol
    from modeld.errors import ModelNotFoundError

    c.load("tiny")
    with pytest.raises(ModelNotFoundError, match="loaded: tiny"):
        c.unload("default")


@pytest.mark.parametrize(("route", "body", "field"), [
    ("/v1/chat/completions", {"model": 123, "messages": [{"role": "user", "content": "hi"}]},
     "'model'"),
    ("/v1/completions", {"model": ["x"], "prompt": "hi"}, "'model'"),
    ("/api/chat", {"model": 123, "messages": [{"role": "user", "content": "hi"}]}, "'model'"),
    ("/api/generate", {"model": "tiny", "prompt": "hi", "stream": "no"}, "'stream'"),
    ("/v1/chat/completions", {"model": "tiny", "stream": "no",
                              "messages": [{"role": "user", "content": "hi"}]}, "'stream'"),
    ("/api/chat", None, "no body"),
    ("/api/generate", None, "no body"),
    ("/v1/chat/completions", None, "no body"),
])
def test_unchecked_input_is_a_400_in_the_apis_shape(
    served: Served, route: str, body: dict[str, Any] | None, field: str
) -> None:
    """Item 5 (its parts outside the generate-options table): each is a 400 naming the field,
    in the API's JSON error shape, and nothing is loaded."""
    r = httpx.post(f"{served.base}{route}", timeout=30,
                   **({"json": body} if body is not None else {}))
    assert r.status_code == 400, (route, r.status_code, r.text)
    err = r.json()["error"]
    message = err["message"] if route.startswith("/v1") else err
    if route.startswith("/v1"):
        assert err["type"] == "invalid_request_error", err
    assert field in message, message
    assert served.d.client().ps() == []


def test_num_ctx_past_training_is_capped_and_the_reload_is_timed(served: Served) -> None:
    """Item 5: options.num_ctx 300000 loads at the training context with a note in ps, and
    the reply's load_duration is the reload it waited for (it said 0)."""
    c = served.d.client()
    c.load("tiny", n_ctx=256)
    r = httpx.post(f"{served.base}/api/generate", timeout=120, json={
        "model": "tiny", "prompt": "hi", "stream": False,
        "options": {"num_ctx": 300000, "num_predict": 2}})
    assert r.status_code == 200, r.text
    (row,) = c.ps()
    training = c.show("tiny")["info"]["context_length"]
    assert row["n_ctx"] == training < 300000, row
    assert "capped at the training context" in row["ctx_reason"], row["ctx_reason"]
    assert r.json()["load_duration"] > 0, r.json()

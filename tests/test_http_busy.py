"""Busy answers carry advice (issue 21, item 6): a full queue's 503 says when to retry,
an oversized body is a 413, /api/ps lists every mode ``modeld ps`` does, and ``show`` names
max_models when that is why a model would be evicted. A real daemon and runners."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from daemonutil import until
from test_http import Served, _answers, free_port

Factory = Callable[..., Any]


def _serve(daemon_factory: Factory, models: dict[str, Path], *args: str) -> Served:
    port = free_port()
    d = daemon_factory("--http", f"127.0.0.1:{port}", *args)
    (d.root / "models").mkdir(exist_ok=True)
    for name, path in models.items():
        (d.root / "models" / f"{name}.gguf").write_bytes(path.read_bytes())
    until(lambda: _answers(port), timeout=30, what="the HTTP front door")
    return Served(d, port)


def test_a_full_queue_says_when_to_retry(daemon_factory: Factory, default_model: Path) -> None:
    s = _serve(daemon_factory, {}, "--max-queue", "1", "--parallel", "1",
               "--runner-stall", "3600")
    c = s.d.client()
    c.load(None)
    body = {"model": "default", "prompt": "1, 2, 3,", "raw": True, "stream": False,
            "options": {"num_predict": 2000, "temperature": 0}}
    short = {**body, "options": {"num_predict": 4, "temperature": 0}}
    threads = [threading.Thread(target=lambda doc=doc: httpx.post(
        f"{s.base}/api/generate", json=doc, timeout=300)) for doc in (body, short)]
    threads[0].start()
    until(lambda: any(r["in_flight"] for r in c.ps()), timeout=60, what="one request running")
    pid = int(c.ps()[0]["runner_pid"])
    os.kill(pid, signal.SIGSTOP)  # it stays running; the next one queues
    try:
        threads[1].start()
        until(lambda: c.ps()[0]["queued"] == 1, timeout=60, what="one request queued")
        for route, doc in (("/api/generate", body),
                           ("/v1/chat/completions", {"model": "default", "max_tokens": 4,
                            "messages": [{"role": "user", "content": "hi"}]})):
            r = httpx.post(f"{s.base}{route}", json=doc, timeout=30)
            assert r.status_code == 503 and "queued" in r.text, (route, r.status_code, r.text)
            assert int(r.headers["retry-after"]) >= 1, r.headers
    finally:
        os.kill(pid, signal.SIGKILL)  # both requests end (runner_crashed), nothing is left
    for t in threads:
        t.join(60)
    until(lambda: s.stats()["in_flight"] == 0, timeout=30, what="nothing in flight")


def test_an_oversized_body_is_a_413(daemon_factory: Factory) -> None:
    s = _serve(daemon_factory, {}, "--max-message-bytes", "65536")
    for route in ("/api/generate", "/v1/chat/completions"):
        r = httpx.post(f"{s.base}{route}", content=b"{" + b" " * 70000 + b"}", timeout=30)
        assert r.status_code == 413 and "larger than" in r.text, (route, r.status_code, r.text)


def test_api_ps_lists_every_mode_and_show_names_max_models(
    daemon_factory: Factory, tiny_chat_model: Path, tiny_model: Path, reranker: Path
) -> None:
    s = _serve(daemon_factory, {"tiny": tiny_chat_model, "other": tiny_model,
                                "ranker": reranker}, "--max-models", "3")
    c = s.d.client()
    c.load("tiny")
    c.load("other", mode="embed")
    c.load("ranker")
    names = sorted(m["name"] for m in httpx.get(f"{s.base}/api/ps").json()["models"])
    assert names == sorted(r["name"] for r in c.ps()) and len(names) == 3, names
    # max_models 3 is reached: a fourth model would evict one for its slot, not for memory
    shown = httpx.post(f"{s.base}/api/show", json={"model": "other"}, timeout=30).json()
    reason = shown["modeld"]["plan_reason"]
    assert "max_models 3" in reason and "to free" not in reason, reason

"""Issue 45, bounded work, against a real daemon behind the HTTP front door (tiny generated
models): each hostile request gets its 400 and the daemon goes on serving; a giant schema's
build holds no small request back and stops when its client leaves; a hostile chat template
costs its request a 400, never the model. No wall-clock asserts: outcomes and orderings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import ggufgen
from daemonutil import children, until
from modeld.wire.textcheck import MAX_DEPTH
from test_http import Served, free_port, start_served

Factory = Callable[..., Any]
SMALL_FORMAT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _post(s: Served, route: str, body: Any, timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{s.base}{route}", content=json.dumps(body).encode(), timeout=timeout,
                      headers={"content-type": "application/json"})


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def _small_format_answered(s: Served) -> None:
    r = _post(s, "/api/chat", {"model": "tiny", "stream": False, "format": SMALL_FORMAT,
                               "messages": [{"role": "user", "content": "a number"}],
                               "options": {"num_predict": 8, "temperature": 0}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("levels", [900, 1_000, 5_000])
def test_deep_tool_call_arguments_are_a_400_naming_the_field_on_every_api(
        daemon_factory: Factory, tiny_chat_model: Path, levels: int) -> None:
    s = start_served(daemon_factory, tiny_chat_model)
    args = _deep(levels)
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": args}}
    asks = {
        "/v1/chat/completions": {"model": "tiny", "max_tokens": 4, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]},
        "/v1/responses": {"model": "tiny", "max_output_tokens": 16, "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": args},
            {"type": "function_call_output", "call_id": "call_1", "output": "ok"}]},
        "/api/chat": {"model": "tiny", "stream": False, "options": {"num_predict": 4},
                      "messages": [{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": "", "tool_calls": [
                                       {"function": {"name": "f", "arguments": args}}]}]},
    }
    for route, body in asks.items():
        r = _post(s, route, body)
        assert r.status_code == 400, (route, r.status_code, r.text[:300])
        assert f"deeper than {MAX_DEPTH} levels" in r.text, (route, r.text[:300])
        assert "arguments" in r.text, (route, r.text[:300])
    _small_format_answered(s)  # the daemon kept serving
    assert "internal error" not in s.d.log_text()


def test_an_8mb_enum_is_refused_naming_its_path_and_the_next_format_is_answered(
        daemon_factory: Factory, tiny_chat_model: Path) -> None:
    s = start_served(daemon_factory, tiny_chat_model)
    words = [f"w{i:010d}" for i in range(700_000)]  # 8.4 MB of JSON
    r = _post(s, "/api/chat", {"model": "tiny", "stream": False, "messages": [
        {"role": "user", "content": "pick"}], "format": {
            "type": "object", "properties": {"w": {"enum": words}}, "required": ["w"]}})
    assert r.status_code == 400, r.text[:300]
    assert "#/properties/w/enum" in r.text and "max_grammar_bytes" in r.text, r.text[:300]
    _small_format_answered(s)


def _builders(pid: int) -> set[int]:
    """The daemon's grammar-building children (python -m modeld.daemon.grammarproc)."""
    out = set()
    for child in children(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"modeld.daemon.grammarproc" in f.read():
                    out.add(child)
        except OSError:
            pass
    return out


_HEAVY_CLIENT = """
import json, sys, httpx
words = [f"w{i:011d}" for i in range(300_000)]
body = {"model": "tiny", "stream": False, "messages": [{"role": "user", "content": "pick"}],
        "format": {"enum": words}, "options": {"num_predict": 4}}
httpx.post(sys.argv[1] + "/api/chat", content=json.dumps(body).encode(), timeout=600,
           headers={"content-type": "application/json"})
"""


def test_giant_schemas_hold_no_small_request_back_and_stop_when_their_clients_leave(
        daemon_factory: Factory, tiny_chat_model: Path, tmp_path: Path) -> None:
    """Two clients send 300,000-word enums (allowed by a raised max_grammar_bytes: each build
    takes seconds) and a third a small format while both builds run: it is answered while
    both builder processes are still alive (before, both build threads waited on them and
    it queued behind). The heavy clients then leave: their builders are killed."""
    port = free_port()
    d = daemon_factory("--http", f"127.0.0.1:{port}",
                       env={"MODELD_MAX_GRAMMAR_BYTES": str(64 << 20)})
    (d.root / "models").mkdir(exist_ok=True)
    (d.root / "models" / "tiny.gguf").write_bytes(tiny_chat_model.read_bytes())
    s = Served(d, port)
    until(lambda: httpx.get(f"{s.base}/", timeout=2).status_code == 200, timeout=30,
          what="the HTTP front door")
    _small_format_answered(s)  # the model loaded
    script = tmp_path / "heavy.py"
    script.write_text(_HEAVY_CLIENT)
    clients = [subprocess.Popen([sys.executable, str(script), s.base]) for _ in range(2)]
    try:
        builders = until(lambda: b if len(b := _builders(d.proc.pid)) >= 2 else None,
                         timeout=120, what="two builder processes")
        _small_format_answered(s)
        alive = {pid for pid in builders if Path(f"/proc/{pid}").exists()}
        assert alive == builders, "a giant build ended before the small request was answered"
    finally:
        for c in clients:
            c.kill()
            c.wait()
    until(lambda: not _builders(d.proc.pid), timeout=60, what="the builders killed")
    until(lambda: d.log_text().count("its caller left") >= 2, timeout=30,
          what="both builds stopped as cancelled", show=lambda: d.log_text()[-3000:])
    _small_format_answered(s)


LOOPING = ("{% for m in messages %}{% if 'hang' in m.content %}{% for i in range(100000) %}"
           "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}"
           "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
           "<|im_start|>assistant\n")


def _served_with_template(daemon_factory: Factory, model_factory: Callable[..., Path],
                          template: str) -> Served:
    model = model_factory("llama", **{**ggufgen.TINY, "chat_template": template})
    return start_served(daemon_factory, model)


def test_a_template_that_loops_costs_its_request_a_400_not_the_model(
        daemon_factory: Factory, model_factory: Callable[..., Path]) -> None:
    s = _served_with_template(daemon_factory, model_factory, LOOPING)
    chat = {"model": "tiny", "stream": False, "options": {"num_predict": 4}}
    ok = _post(s, "/api/chat", {**chat, "messages": [{"role": "user", "content": "hello"}]})
    assert ok.status_code == 200, ok.text
    bad = _post(s, "/api/chat", {**chat, "messages": [{"role": "user", "content": "hang"}]})
    assert bad.status_code == 400, bad.text
    assert "chat template" in bad.text and "was stopped" in bad.text, bad.text
    again = _post(s, "/api/chat", {**chat, "messages": [{"role": "user", "content": "hi"}]})
    assert again.status_code == 200, again.text  # the model serves on, not wedged
    (row,) = s.d.client().ps()
    assert row["state"] == "ready" and row["in_flight"] == 0


def test_a_template_that_loops_at_load_still_loads(
        daemon_factory: Factory, model_factory: Callable[..., Path]) -> None:
    """The runner renders one probe message at load ("modeld probe"): a template that loops
    on it is stopped there, and the load completes (it was a 503 after 120 s)."""
    s = _served_with_template(daemon_factory, model_factory, LOOPING.replace("hang", "probe"))
    r = _post(s, "/api/generate", {"model": "tiny", "prompt": "hi", "raw": True,
                                   "stream": False, "options": {"num_predict": 2}})
    assert r.status_code == 200, r.text


def test_a_template_syntax_error_is_a_400_that_says_so(
        daemon_factory: Factory, model_factory: Callable[..., Path]) -> None:
    s = _served_with_template(daemon_factory, model_factory,
                              "{% for m in messages %}{{ m.content }}")
    r = _post(s, "/api/chat", {"model": "tiny", "stream": False, "options": {"num_predict": 2},
                               "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400, r.text
    assert "syntax error" in r.text, r.text


def test_count_tokens_past_the_training_context_is_refused_before_tokenizing(
        daemon_factory: Factory, tiny_chat_model: Path) -> None:
    s = start_served(daemon_factory, tiny_chat_model)
    text = "lorem ipsum dolor " * 200_000  # 3.6 MB: the tiny model trained on 512 tokens
    r = _post(s, "/v1/messages/count_tokens", {"model": "tiny", "messages": [
        {"role": "user", "content": text}]})
    assert r.status_code == 400, r.text[:300]
    assert "at least" in r.text and "was trained for" in r.text, r.text[:300]
    small = _post(s, "/v1/messages/count_tokens", {"model": "tiny", "messages": [
        {"role": "user", "content": "hello"}]})
    assert small.status_code == 200 and small.json()["input_tokens"] > 0, small.text

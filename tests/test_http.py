"""The HTTP front door, driven by the official ``ollama`` and ``openai`` clients against a real
daemon (real runners, generated models). The daemon's own requests underneath are the CLI's, so
these tests check the translation: shapes, statuses, streaming, cancellation and access rules."""

from __future__ import annotations

import base64
import json
import re
import shlex
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

import ggufgen
from daemonutil import until

Factory = Callable[..., Any]
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    def __init__(self, d: Any, port: int) -> None:
        self.d, self.port = d, port
        self.base = f"http://127.0.0.1:{port}"
        self.ollama = ollama.Client(host=self.base, timeout=120)
        self.openai = openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", timeout=120,
                                    max_retries=0)

    def stats(self) -> dict[str, Any]:
        return dict(self.d.client().stats())


@pytest.fixture()
def served(daemon_factory: Factory, tiny_chat_model: Path, tmp_path: Path) -> Iterator[Served]:
    """A daemon with HTTP on a free loopback port; the tiny chat model is ``tiny`` in its
    models dir (so names resolve as for the CLI)."""
    yield start_served(daemon_factory, tiny_chat_model)


def start_served(daemon_factory: Factory, tiny_chat_model: Path, *flags: str) -> Served:
    """:func:`served`'s daemon, with more daemon ``flags``."""
    port = free_port()
    d = daemon_factory("--http", f"127.0.0.1:{port}", *flags)
    models = d.root / "models"
    models.mkdir(exist_ok=True)
    (models / "tiny.gguf").write_bytes(tiny_chat_model.read_bytes())
    until(lambda: _answers(port), timeout=30, what="the HTTP front door")
    return Served(d, port)


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/", timeout=2).text == "Ollama is running"
    except httpx.HTTPError:
        return False


GREEDY = {"temperature": 0, "seed": 1}


def test_ollama_generate_and_chat_streaming_and_not(served: Served) -> None:
    o = served.ollama
    whole = o.generate(model="tiny", prompt="hello there", options={**GREEDY, "num_predict": 12})
    assert whole.done and whole.eval_count == 12 and whole.done_reason == "length"
    assert whole.prompt_eval_count and whole.total_duration and whole.total_duration > 0
    parts = list(o.generate(model="tiny:latest", prompt="hello there", stream=True,
                            options={**GREEDY, "num_predict": 12}))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.response for p in parts) == whole.response  # same greedy text
    messages = [{"role": "user", "content": "hi"}]
    chat = o.chat(model="tiny", messages=messages, options={**GREEDY, "num_predict": 8})
    assert chat.message.role == "assistant" and chat.eval_count == 8
    streamed = list(o.chat(model="tiny", messages=messages, stream=True,
                           options={**GREEDY, "num_predict": 8}))
    assert "".join(p.message.content or "" for p in streamed) == chat.message.content


def test_ollama_embed_tags_ps_show_and_keep_alive_zero(served: Served) -> None:
    o = served.ollama
    vectors = o.embed(model="tiny", input=["one", "two"]).embeddings
    assert len(vectors) == 2 and len(vectors[0]) == 64 and vectors[0] != vectors[1]
    assert o.embeddings(model="tiny", prompt="one").embedding == pytest.approx(vectors[0])
    names = [m.model for m in o.list().models]
    assert "tiny" in names and "default" in names
    o.generate(model="tiny", prompt="", keep_alive="10m")  # an empty prompt loads it
    loaded = o.ps().models
    # generate and embed: /api/ps lists every mode, as modeld ps does (issue 21)
    assert [m.model for m in loaded] == ["tiny", "tiny"] and loaded[0].context_length
    shown = o.show("tiny")
    assert shown.details is not None and shown.details.family == "llama"
    gone = o.generate(model="tiny", prompt="", keep_alive=0)
    assert gone.done_reason == "unload"
    until(lambda: not served.ollama.ps().models, timeout=20, what="the model to unload")


def test_openai_chat_completions_embeddings_models(served: Served) -> None:
    c = served.openai
    messages: Any = [{"role": "user", "content": "hi"}]
    r = c.chat.completions.create(model="tiny", messages=messages, max_tokens=6, **GREEDY)
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 6
    chunks = list(c.chat.completions.create(model="tiny", messages=messages, max_tokens=6,
                                            stream=True, stream_options={"include_usage": True},
                                            **GREEDY))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == r.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    details = chunks[-1].usage.prompt_tokens_details  # the same prompt again: from the cache
    assert details is not None and details.cached_tokens == chunks[-1].usage.prompt_tokens
    t = c.completions.create(model="tiny", prompt="1, 2, 3,", max_tokens=5, **GREEDY)
    assert t.object == "text_completion" and t.usage and t.usage.completion_tokens == 5
    # The SDK asks for base64 by default (ollama#6934): decoded, the same floats.
    sdk = c.embeddings.create(model="tiny", input=["one", "two"]).data
    floats = c.embeddings.create(model="tiny", input=["one", "two"],
                                 encoding_format="float").data
    assert sdk[0].embedding == pytest.approx(floats[0].embedding)
    raw = httpx.post(f"{served.base}/v1/embeddings", json={"model": "tiny", "input": "one",
                                                           "encoding_format": "base64"}).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(packed) // 4}f", packed)) == pytest.approx(
        floats[0].embedding)
    assert "tiny" in [m.id for m in c.models.list()]


def test_ollama_style_options_are_honoured_on_both_apis(served: Served) -> None:
    """``num_gpu`` (Ollama's GPU layers), ``num_ctx`` and ``keep_alive``, in Ollama's
    ``options`` and at the top level of an OpenAI request (as Ollama's OpenAI API takes them:
    they were accepted there and dropped, issue 34). On a CPU build GPU layers change nothing,
    so they cost no reload; a larger context does."""
    o, ps = served.ollama, lambda: served.d.client().ps()
    o.generate(model="tiny", prompt="hi", options={**GREEDY, "num_predict": 2, "num_ctx": 512,
                                                   "num_gpu": 99})  # fmt: skip
    (row,) = ps()
    assert row["n_ctx"] == 512 and row["processor"] == "100% CPU" and row["gpu_layers"] == 0
    r = httpx.post(f"{served.base}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "keep_alive": "7m", "num_ctx": 1024, "num_gpu": 0, **GREEDY})  # fmt: skip
    assert r.status_code == 200, r.text
    (row,) = ps()
    assert row["n_ctx"] == 1024 and row["keep_alive_s"] == 420  # honoured, not dropped
    o.generate(model="tiny", prompt="hi", options={**GREEDY, "num_predict": 2, "num_gpu": 5})
    assert served.stats()["evictions"]["reload"] == 1  # the context's; none for num_gpu
    bad = httpx.post(f"{served.base}/api/generate", timeout=60, json={
        "model": "tiny", "prompt": "hi", "options": {"num_gpu": "all"}})  # fmt: skip
    assert bad.status_code == 400 and "gpu_layers" in bad.json()["error"], bad.text


def test_errors_have_the_apis_shapes_and_statuses(served: Served) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        served.ollama.generate(model="no-such-model", prompt="x")
    assert info.value.status_code == 404 and "modeld list" in info.value.error
    with pytest.raises(openai.NotFoundError) as nf:
        served.openai.chat.completions.create(model="no-such-model",
                                              messages=[{"role": "user", "content": "x"}])
    assert nf.value.status_code == 404
    too_long = " ".join(f"word{i}" for i in range(6000))  # the tiny model's training ctx: 2048
    with pytest.raises(ollama.ResponseError) as long_o:
        served.ollama.generate(model="tiny", prompt=too_long, stream=True).__next__()
    assert long_o.value.status_code == 400 and "tokens" in long_o.value.error
    with pytest.raises(openai.BadRequestError) as long_a:
        served.openai.completions.create(model="tiny", prompt=too_long, max_tokens=2)
    body: Any = long_a.value.body
    assert body["code"] == "context_exceeded"
    bad = httpx.post(f"{served.base}/api/generate", content=b"{not json")
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]


def test_a_client_that_disconnects_cancels_its_generation(
    served: Served, model_factory: Factory
) -> None:
    long_model = model_factory("llama", **dict(ggufgen.TINY, context_length=32768))
    (served.d.root / "models" / "long.gguf").write_bytes(long_model.read_bytes())
    served.ollama.generate(model="long", prompt="", keep_alive="10m")
    body = {"model": "long", "prompt": "a", "options": {"num_predict": -1, "num_ctx": 32768,
                                                        "temperature": 0}}
    with httpx.stream("POST", f"{served.base}/api/generate", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert json.loads(next(lines))["done"] is False
    # The connection is closed: the daemon is told at once and the runner stops.
    until(lambda: served.stats()["in_flight"] == 0, timeout=15, what="the request to end")
    tokens = served.stats()["tokens_generated"]
    time.sleep(1.0)
    assert served.stats()["tokens_generated"] == tokens < 32768  # stopped, not run to the end


def test_host_and_origin_checks(served: Served) -> None:
    url = f"{served.base}/api/tags"
    assert httpx.get(url).status_code == 200
    assert httpx.get(url, headers={"Host": "localhost:1"}).status_code == 200
    rebound = httpx.get(url, headers={"Host": "attacker.example"})
    assert rebound.status_code == 403 and "rebinding" in rebound.json()["error"]
    assert httpx.get(url, headers={"Origin": "https://attacker.example"}).status_code == 403
    ok = httpx.get(url, headers={"Origin": "http://localhost:3000"})
    assert ok.status_code == 200 and "access-control-allow-origin" not in ok.headers
    big = httpx.post(f"{served.base}/api/generate", content=b"x" * (17 << 20))
    assert big.status_code == 413 and "larger than" in big.json()["error"]


def test_metrics(served: Served) -> None:
    served.ollama.generate(model="tiny", prompt="hi", options={"num_predict": 3})
    text = httpx.get(f"{served.base}/metrics").text
    for name in ("modeld_requests_total", "modeld_tokens_generated_total", "modeld_loads_total",
                 "modeld_evictions_total", "modeld_budget_bytes", "modeld_used_bytes",
                 "modeld_queue_depth", "modeld_model_measured_bytes",
                 "modeld_model_n_ctx", "modeld_http_request_seconds_bucket"):
        assert name in text, name
    assert re.search(r'modeld_model_n_ctx\{mode="generate",model="tiny"\} \d+', text)
    assert 'modeld_backend{backend="CPU"} 1.0' in text  # this machine's build: no card
    assert 'modeld_model_vram_bytes{mode="generate",model="tiny"} 0.0' in text
    assert "modeld_vram_used_bytes{" not in text  # no card, no per-card series


def test_metrics_per_card() -> None:
    """/metrics per card, from the daemon's stats (what a CUDA build's stats carry)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from modeld.http.metrics import StatsCollector

    snap, registry = StatsCollector(), CollectorRegistry(auto_describe=False)
    registry.register(snap)
    gib = 1 << 30
    snap.stats = {"backend": "CUDA", "devices": [
        {"name": "CPU", "type": "cpu"},
        {"name": "CUDA0", "type": "gpu", "total_bytes": 80 * gib, "free_bytes": 70 * gib,
         "budget_bytes": 79 * gib, "used_bytes": 9 * gib, "estimate_bytes": 8 * gib},
        {"name": "CUDA1", "type": "gpu", "total_bytes": 24 * gib, "free_bytes": 24 * gib,
         "budget_bytes": 23 * gib, "used_bytes": 0, "estimate_bytes": 0}]}
    snap.ps = {"models": [{"name": "big", "mode": "generate", "size_vram": 9 * gib}]}
    found = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
             for line in generate_latest(registry).decode().splitlines()
             if not line.startswith("#")}  # fmt: skip
    assert found['modeld_backend{backend="CUDA"}'] == 1
    assert found['modeld_vram_used_bytes{device="CUDA0"}'] == 9 * gib
    assert found['modeld_vram_estimate_bytes{device="CUDA0"}'] == 8 * gib
    assert found['modeld_vram_budget_bytes{device="CUDA1"}'] == 23 * gib
    assert not any('device="CPU"' in k for k in found)
    assert found['modeld_model_vram_bytes{mode="generate",model="big"}'] == 9 * gib


def test_non_loopback_needs_an_api_key(daemon_factory: Factory, tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "c.toml").touch()
    refused = subprocess.run(
        [sys.executable, "-m", "modeld.daemon", "--http", f"0.0.0.0:{port}",
         "--socket", f"ipc://{tmp_path}/s.sock"],
        capture_output=True, text=True, timeout=60,
        env={**_env(tmp_path), "MODELD_API_KEY": ""},
    )
    assert refused.returncode == 2 and "api_key" in refused.stderr, refused.stderr
    d = daemon_factory("--http", f"0.0.0.0:{port}", env={"MODELD_API_KEY": "s3cret"})
    until(lambda: httpx.get(f"http://127.0.0.1:{port}/api/version").status_code == 401,
          timeout=30, what="the front door")
    ok = httpx.get(f"http://127.0.0.1:{port}/api/version",
                   headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and d.proc.poll() is None


def test_port_taken_is_a_warning_and_zeromq_still_serves(daemon_factory: Factory) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        d = daemon_factory("--http", f"127.0.0.1:{port}")
        assert d.client().ping()["pong"]
        until(lambda: "HTTP front door not started" in d.log_text(), timeout=10,
              what="the warning")


def test_readme_curl_examples_work(served: Served, reranker: Path) -> None:
    """Each ``curl`` line of the README's "Use with other tools" section, replayed against
    this daemon (port swapped, ``default`` model as written; ``bge-reranker`` is the tiny
    generated reranker)."""
    (served.d.root / "models" / "bge-reranker.gguf").write_bytes(reranker.read_bytes())
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Use with other tools", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in section.splitlines() if line.startswith("curl ")]
    assert len(commands) >= 4
    for command in commands:
        args = shlex.split(command.replace("11434", str(served.port)))
        url = next(a for a in args if a.startswith("http"))
        data = args[args.index("-d") + 1] if "-d" in args else None
        r = (httpx.post(url, content=data, timeout=120) if data is not None
             else httpx.get(url, timeout=30))
        assert r.status_code == 200, (command, r.status_code, r.text[:300])
        assert r.text.strip(), command


def _env(tmp: Path) -> dict[str, str]:
    import os

    return {**os.environ, "MODELD_RUNTIME_DIR": str(tmp / "run"), "MODELD_LOG_DIR": str(tmp),
            "MODELD_CONFIG": str(tmp / "c.toml"), "MODELD_MODELS": str(tmp / "m"),
            "PYTHONPATH": str(ROOT / "src")}

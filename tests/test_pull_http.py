"""Ollama's ``/api/pull`` and ``/api/delete`` on a real daemon, driven by the official
``ollama`` client, against the loopback fake hub (tests/fakehub.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from daemonutil import until
from fakehub import FakeHub
from test_http import _answers, free_port

Q4 = "tiny-Q4_K_M.gguf"
NAME = "hf.co/org/tiny-GGUF:Q4_K_M"


@pytest.fixture()
def served(daemon_factory: Any, hub: FakeHub, tiny_chat_model: Path,
           tmp_path: Path) -> Iterator[tuple[ollama.Client, Path]]:
    hub.add("org/tiny-GGUF", {Q4: tiny_chat_model.read_bytes(), "tiny-Q8_0.gguf": b"GGUF"})
    port = free_port()
    d = daemon_factory("--http", f"127.0.0.1:{port}",
                       env={"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")})
    until(lambda: _answers(port), timeout=30, what="the HTTP front door")
    yield ollama.Client(host=f"http://127.0.0.1:{port}", timeout=120), d.root / "models"


def test_ollama_client_pulls_lists_chats_and_deletes(served: tuple[ollama.Client, Path],
                                                    hub: FakeHub) -> None:
    client, models = served
    parts = list(client.pull(NAME, stream=True))
    statuses = [p.status for p in parts]
    sha = hub.file("org/tiny-GGUF", Q4).sha256
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    progress = [p for p in parts if p.digest]
    assert progress and all(p.status == f"pulling {sha[:12]}" for p in progress)
    assert all(p.digest == f"sha256:{sha}" and p.total == hub.file("org/tiny-GGUF", Q4).size
               for p in progress)  # fmt: skip
    assert progress[-1].completed == progress[-1].total
    completed = [p.completed or 0 for p in progress]
    assert completed == sorted(completed)
    path = models / "org" / "tiny-GGUF" / Q4
    assert path.is_file()

    tags = {m.model: m for m in client.list().models}
    assert tags[NAME].digest == sha and tags[NAME].size == path.stat().st_size
    reply = client.chat(model=NAME, messages=[{"role": "user", "content": "hi"}],
                        options={"num_predict": 3, "temperature": 0})
    assert reply.done

    # pulled again without streaming: one document, nothing downloaded again
    sent = hub.sent_bytes("org/tiny-GGUF", Q4)
    assert client.pull(NAME).status == "success"
    assert hub.sent_bytes("org/tiny-GGUF", Q4) == sent

    assert client.delete(NAME).status == "success"  # loaded: unloaded first
    assert not path.exists() and NAME not in {m.model for m in client.list().models}
    with pytest.raises(ollama.ResponseError) as err:
        client.delete(NAME)
    assert err.value.status_code == 404


def test_pull_errors_are_statuses_before_any_output(served: tuple[ollama.Client, Path]) -> None:
    client, _ = served
    with pytest.raises(ollama.ResponseError) as err:
        list(client.pull("hf.co/org/none", stream=True))
    assert err.value.status_code == 404 and "no repository org/none" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("hf.co/org/tiny-GGUF:Q2_K")
    assert err.value.status_code == 404 and "has no Q2_K file" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("llama3.2")  # Ollama's own registry is not modeld's: a 400 that says so
    assert err.value.status_code == 400 and "hf.co/ORG/REPO" in err.value.error
    base = str(client._client.base_url)
    r = httpx.post(f"{base}/api/pull", json={"model": "https://evil.example/org/r:Q4_K_M"})
    assert r.status_code == 400  # a URL from the request is never fetched (SSRF)


def test_a_client_that_leaves_cancels_its_pull_and_the_next_resumes(
        served: tuple[ollama.Client, Path], hub: FakeHub) -> None:
    import json
    import time

    from fakehub import Fault, HubFile

    client, models = served
    data = bytes(range(233)) * 1300  # ~300 KB at 60 KB/s: about 5 s
    hub.add("org/slow", {Q4: HubFile(data=data, fault=Fault(bytes_per_s=60_000))})
    base = str(client._client.base_url)
    with httpx.stream("POST", f"{base}/api/pull", json={"model": "hf.co/org/slow"},
                      timeout=30) as r:
        for line in r.iter_lines():
            if json.loads(line).get("completed"):
                break  # some bytes arrived: leave
    time.sleep(1.0)  # the worker notices at its next chunk (every 0.1 s)
    stopped_at = hub.sent_bytes("org/slow", Q4)
    time.sleep(1.0)
    assert hub.sent_bytes("org/slow", Q4) == stopped_at < len(data)
    assert not (models / "org" / "slow").exists()  # nothing visible, the partial file kept
    hub.file("org/slow", Q4).fault.bytes_per_s = None
    assert client.pull("hf.co/org/slow").status == "success"
    assert hub.downloads("org/slow", Q4)[-1] not in (None, "bytes=0-")  # resumed
    assert hub.sent_bytes("org/slow", Q4) <= 1.1 * len(data)
    assert (models / "org" / "slow" / Q4).read_bytes() == data

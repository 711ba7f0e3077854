"""Images through a real daemon and every HTTP API (issue 38), sent by the official ollama,
openai and anthropic clients: a generated model ``seer`` with its generated projector
``mmproj-seer.gguf`` beside it in the models dir, and a text-only model that refuses by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

import ggufgen
import imageutil
from agentutil import Agent, start

pytestmark = pytest.mark.slow

Factory = Callable[..., Any]
N_IMAGE = ggufgen.mmproj_tokens(ggufgen.TINY_MMPROJ)
PNG_A, PNG_B = imageutil.noise(1), imageutil.noise(2)
GREEDY = {"temperature": 0.0}


@pytest.fixture()
def agent(daemon_factory: Factory, model_factory: Factory) -> Iterator[Agent]:
    a = start(daemon_factory)
    models = a.d.root / "models"
    models.mkdir(exist_ok=True)
    for name, kind, params in (("seer.gguf", "llama", ggufgen.VISION_CHAT),
                               ("mmproj-seer.gguf", "mmproj", ggufgen.TINY_MMPROJ),
                               ("blind.gguf", "llama", ggufgen.TINY_CHAT)):  # fmt: skip
        (models / name).write_bytes(Path(model_factory(kind, **params)).read_bytes())
    yield a


def test_ollama_images_on_chat_and_generate(agent: Agent) -> None:
    client = ollama.Client(host=agent.base, timeout=120)
    opts = {"temperature": 0, "num_predict": 8}
    text = client.chat(model="seer", messages=[{"role": "user", "content": "what is this?"}],
                       options=opts)  # fmt: skip
    seen = client.chat(model="seer", options=opts, messages=[
        {"role": "user", "content": "what is this?", "images": [PNG_A]}])
    assert seen.prompt_eval_count == text.prompt_eval_count + N_IMAGE
    other = client.chat(model="seer", options=opts, messages=[
        {"role": "user", "content": "what is this?", "images": [PNG_B]}])
    assert other.message.content != seen.message.content
    again = client.chat(model="seer", options=opts, messages=[
        {"role": "user", "content": "what is this?", "images": [PNG_A]}])
    assert again.message.content == seen.message.content
    gen = client.generate(model="seer", prompt="describe", images=[PNG_A], options=opts)
    plain = client.generate(model="seer", prompt="describe", options=opts)
    assert gen.prompt_eval_count == plain.prompt_eval_count + N_IMAGE
    show = client.show("seer")
    assert "vision" in (show.capabilities or [])
    assert "vision" not in (client.show("blind").capabilities or [])


def test_openai_chat_and_responses_take_data_uris(agent: Agent) -> None:
    uri = imageutil.data_uri(PNG_A)
    ask = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                        {"type": "text", "text": "what is this?"}]}]
    chat = agent.openai.chat.completions.create(model="seer", messages=ask,  # type: ignore[arg-type]
                                                max_tokens=8, **GREEDY)  # fmt: skip
    text = agent.openai.chat.completions.create(
        model="seer", max_tokens=8, messages=[{"role": "user", "content": "what is this?"}],
        **GREEDY)  # fmt: skip
    assert chat.usage and text.usage
    assert chat.usage.prompt_tokens == text.usage.prompt_tokens + N_IMAGE
    resp = agent.openai.responses.create(model="seer", max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "what is this?"},
                                     {"type": "input_image", "image_url": uri}]}])  # type: ignore[list-item,typeddict-item]
    # the image after the text: the text after it is tokenized on its own (as llama-server
    # does), which may take a token more where the split falls mid-word
    assert resp.usage and 0 <= resp.usage.input_tokens - chat.usage.prompt_tokens <= 2
    remote = httpx.post(f"{agent.base}/v1/chat/completions", timeout=60, json={
        "model": "seer", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]})
    assert remote.status_code == 400 and "remote URL" in remote.text
    assert "fetches nothing" in remote.text


def test_anthropic_image_blocks(agent: Agent) -> None:
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": imageutil.b64(PNG_A)}}
    msg = agent.anthropic.messages.create(model="seer", max_tokens=8, extra_body=GREEDY, messages=[
        {"role": "user", "content": [block, {"type": "text", "text": "what is this?"}]}])  # type: ignore[list-item]
    plain = agent.anthropic.messages.create(model="seer", max_tokens=8, extra_body=GREEDY,
                                            messages=[{"role": "user", "content": "what is this?"}])
    total = msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
    plain_total = plain.usage.input_tokens + (plain.usage.cache_read_input_tokens or 0)
    assert total == plain_total + N_IMAGE
    url = httpx.post(f"{agent.base}/v1/messages", timeout=60, json={
        "model": "seer", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]})
    assert url.status_code == 400 and "fetches nothing" in url.text


def test_limits_and_refusals(agent: Agent) -> None:
    def chat(model: str, images: list[str]) -> httpx.Response:
        return httpx.post(f"{agent.base}/api/chat", timeout=60, json={
            "model": model, "stream": False, "options": {"num_predict": 2},
            "messages": [{"role": "user", "content": "hi", "images": images}]})

    blind = chat("blind", [imageutil.b64(PNG_A)])
    assert blind.status_code == 400 and "'blind' cannot see images" in blind.text
    assert "mmproj" in blind.text
    many = chat("seer", [imageutil.b64(PNG_A)] * 17)
    assert many.status_code == 400 and "at most 16" in many.text
    junk = chat("seer", [imageutil.b64(b"not an image at all")])
    assert junk.status_code == 400 and "not a PNG, JPEG, WebP or GIF" in junk.text
    bad64 = chat("seer", ["%%%"])
    assert bad64.status_code == 400 and "not valid base64" in bad64.text
    ok = chat("seer", [imageutil.b64(imageutil.noise(5, fmt="WEBP"))])
    assert ok.status_code == 200, ok.text

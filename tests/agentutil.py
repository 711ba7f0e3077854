"""A daemon with its HTTP front door on the default model, driven by the official ``anthropic``
and ``openai`` clients (what Claude Code and Codex speak), for the agent-API tests."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai

from daemonutil import until

#: Greedy and reproducible; the 2026 anthropic SDK has no ``temperature`` argument any more,
#: so it travels in the body.
GREEDY = {"temperature": 0}

WEATHER = {
    "name": "get_weather",
    "description": "The current weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/", timeout=2).text == "Ollama is running"
    except httpx.HTTPError:
        return False


class Agent:
    """The daemon's HTTP front door and the two official clients pointed at it."""

    def __init__(self, d: Any, port: int) -> None:
        self.d, self.port = d, port
        self.base = f"http://127.0.0.1:{port}"
        self.anthropic = anthropic.Anthropic(base_url=self.base, api_key="unused", timeout=300,
                                             max_retries=0)
        self.openai = openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", timeout=300,
                                    max_retries=0)


def start(daemon_factory: Callable[..., Any], *args: str, **kw: Any) -> Agent:
    port = free_port()
    d = daemon_factory("--http", f"127.0.0.1:{port}", *args, **kw)
    until(lambda: answers(port), timeout=30, what="the HTTP front door")
    return Agent(d, port)


def add_thinker(agent: Agent, model_factory: Callable[..., Any]) -> str:
    """A tiny generated model with DeepSeek-R1's template, as ``thinker`` in the daemon's
    models dir: the template opens ``<think>`` in the prompt, so its whole (random) reply is
    thinking."""
    import ggufgen

    template = (Path(__file__).parent / "templates" /
                "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text()
    path = model_factory("llama", **dict(ggufgen.TINY, chat_template=template))
    (agent.d.root / "models").mkdir(exist_ok=True)
    (agent.d.root / "models" / "thinker.gguf").write_bytes(Path(path).read_bytes())
    return "thinker"


def satisfies(value: Any, schema: dict[str, Any]) -> bool:
    """Whether ``value`` fits the small JSON Schemas these tests use (object, string,
    integer, required)."""
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return False
        if any(k not in value for k in schema.get("required", [])):
            return False
        props = schema.get("properties", {})
        return all(satisfies(v, props[k]) for k, v in value.items() if k in props)
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return True

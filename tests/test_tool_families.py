"""Tool calls and thinking on models whose chat templates are the real ones of each family
(Qwen2.5 / Hermes ``<tool_call>``, Llama 3.2 JSON with ``parameters``, Mistral Nemo
``[TOOL_CALLS]``, Qwen3 and DeepSeek-R1 thinking), on generated tiny GGUFs behind a real
daemon: tools reach the template, forced calls come back parsed from the family's own syntax,
tool results round-trip into the next prompt, thinking is split from the text. The weights
are random, so what the model says means nothing; what is checked is the machinery."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

import ggufgen
import test_http
from daemonutil import until
from modeld.runner import chat, prompting
from modeld.runner.specs import GenerateSpec
from modeld.runner.template import render_template
from modeld.wire.messages import ChatMessage, Tool, ToolCall
from modeld.wire.options import Sampling
from test_http import Served, _answers, free_port

TEMPLATES = Path(__file__).parent / "templates"
FAMILY_MODELS = {  # name in the models dir -> template file
    "qwen25": "Qwen-Qwen2.5-7B-Instruct.jinja",
    "llama32": "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "nemo": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "qwen3": "Qwen-Qwen3-0.6B.jinja",
    "r1": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
}
PARAMS = {"type": "object", "required": ["unit"],
          "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"}}}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                         "parameters": PARAMS}}  # fmt: skip
ASK = [{"role": "user", "content": "Weather in Paris?"}]
_ = test_http  # the Served helper lives there


@pytest.fixture()
def family_served(daemon_factory: Callable[..., Any],
                  model_factory: Callable[..., Path]) -> Iterator[Served]:
    port = free_port()
    d = daemon_factory("--http", f"127.0.0.1:{port}")
    models = d.root / "models"
    models.mkdir(exist_ok=True)
    for name, template in FAMILY_MODELS.items():
        path = model_factory("llama", **ggufgen.TINY,
                             chat_template=(TEMPLATES / template).read_text(), name=name)
        (models / f"{name}.gguf").write_bytes(path.read_bytes())
    until(lambda: _answers(port), timeout=30, what="the HTTP front door")
    yield Served(d, port)


def _chat(s: Served, model: str, **body: Any) -> dict[str, Any]:
    body = {"model": model, "messages": ASK, "max_tokens": 12, "temperature": 0, **body}
    r = httpx.post(f"{s.base}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.mark.parametrize("model", ["qwen25", "llama32", "nemo", "qwen3"])
def test_forced_calls_come_back_from_each_family_syntax(family_served: Served,
                                                        model: str) -> None:
    doc = _chat(family_served, model, tools=[TOOL], tool_choice="required", max_tokens=300)
    choice = doc["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    assert choice["message"]["content"] is None  # no marker leaked into the text
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMS)
    # streamed: the same call, arguments in fragments
    with httpx.stream("POST", f"{family_served.base}/v1/chat/completions", timeout=120, json={
            "model": model, "messages": ASK, "max_tokens": 300, "temperature": 0,
            "tools": [TOOL], "tool_choice": "required", "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]  # fmt: skip
    deltas = [tc for e in events for tc in e["choices"][0]["delta"].get("tool_calls", [])]
    assert deltas[0]["function"]["name"] == "get_weather"
    args = "".join(d["function"]["arguments"] for d in deltas)
    assert json.loads(args) == json.loads(call["function"]["arguments"])
    # the call and its result go back into the next prompt in the template's own form
    history = [*ASK, choice["message"],
               {"role": "tool", "tool_call_id": call["id"], "content": '{"t": 21}'}]
    again = _chat(family_served, model, messages=history, tools=[TOOL])
    assert again["usage"]["prompt_tokens"] > doc["usage"]["prompt_tokens"]


@pytest.mark.parametrize("model", ["qwen25", "llama32", "nemo"])
def test_auto_tools_reach_the_template(family_served: Served, model: str) -> None:
    without = _chat(family_served, model, max_tokens=4)
    with_tools = _chat(family_served, model, tools=[TOOL], max_tokens=4)
    # the template wrote the tool's schema into the prompt ("get_weather", its parameters)
    assert with_tools["usage"]["prompt_tokens"] > without["usage"]["prompt_tokens"] + 30
    assert with_tools["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


def test_thinking_is_split_from_the_text(family_served: Served) -> None:
    """DeepSeek-R1's template opens ``<think>`` in the prompt: the reply starts inside it.
    Qwen3 with ``think: false`` gets ``enable_thinking=false`` (an empty block in the prompt)
    and no thinking back."""
    r1 = httpx.post(f"{family_served.base}/api/chat", timeout=120, json={
        "model": "r1", "messages": ASK, "think": True, "stream": False,
        "options": {"temperature": 0, "num_predict": 12}}).json()
    assert r1["message"].get("thinking") and r1["message"]["content"] == ""
    on = _chat(family_served, "qwen3", max_tokens=4)
    off = _chat(family_served, "qwen3", max_tokens=4, reasoning_effort="none")
    assert off["usage"]["prompt_tokens"] > on["usage"]["prompt_tokens"]  # the empty block
    assert "reasoning_content" not in off["choices"][0]["message"]
    caps = {m: family_served.ollama.show(m).capabilities for m in ("qwen3", "r1", "qwen25")}
    assert "thinking" in (caps["qwen3"] or []) and "thinking" in (caps["r1"] or [])
    assert "thinking" not in (caps["qwen25"] or [])


# --------------------------------------------------------------------------- the prompt, pure


def _spec(**kw: Any) -> GenerateSpec:
    base: dict[str, Any] = dict(rid="r", prompt=None, raw=False, sampling=Sampling(),
                                messages=(ChatMessage("user", "Weather in Paris?"),))
    return GenerateSpec(**{**base, **kw})


def _model(template_file: str | None, fmt: str = chat.TEMPLATE) -> prompting.ModelChat:
    template = (TEMPLATES / template_file).read_text() if template_file else None
    return prompting.ModelChat(fmt, template, "<s>", "</s>")


def test_the_prompt_carries_tools_calls_and_results() -> None:
    tool = Tool("get_weather", "Weather", PARAMS)
    history = (ChatMessage("user", "Weather?"),
               ChatMessage("assistant", "", tool_calls=(
                   ToolCall("get_weather", {"unit": "celsius"}, "call_0123456789abcdef"),)),
               ChatMessage("tool", '{"t": 21}', tool_call_id="call_0123456789abcdef",
                           tool_name="get_weather"))  # fmt: skip
    for template, marker in (("Qwen-Qwen2.5-7B-Instruct.jinja", "<tool_response>"),
                             ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "[TOOL_RESULTS]"),
                             ("meta-llama-Llama-3.2-3B-Instruct.jinja", "ipython")):
        p = prompting.build(_spec(messages=history, tools=(tool,)), _model(template),
                            render_template)  # fmt: skip
        assert "get_weather" in p.text and marker in p.text and '"celsius"' in p.text
        assert p.tools and p.family != "generic"
    # a model without a template is shown the tools as text and answers in generic JSON
    plain = prompting.build(_spec(tools=(tool,)), _model(None, chat.QA), render_template)
    assert "get_weather" in plain.text and plain.family == "generic"
    # thinking: off puts Qwen3's empty block in the prompt; R1's prompt opens the block
    off = prompting.build(_spec(think=False), _model("Qwen-Qwen3-0.6B.jinja"), render_template)
    assert off.text.rstrip().endswith("</think>") and not off.thinking_open
    r1 = prompting.build(_spec(), _model("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"),
                         render_template)  # fmt: skip
    assert r1.thinking and r1.thinking_open


def test_cli_format_and_thinking_stay_off_stdout(model_factory: Callable[..., Path],
                                                 tmp_path: Path) -> None:
    """``modeld run --format SCHEMA.json`` prints a reply that validates (an unreadable schema
    file is exit 2 naming --format); a thinking model's thinking never reaches stdout, nor
    ``--json``'s text (on a terminal it is shown dimmed on stderr)."""
    from cliutil import GREEDY, CliEnv

    r1 = model_factory("llama", **ggufgen.TINY, name="r1",
                       chat_template=(TEMPLATES / FAMILY_MODELS["r1"]).read_text())
    schema = tmp_path / "city.json"
    schema.write_text(json.dumps(PARAMS))
    with CliEnv.served() as cli:
        (cli.root / "models" / "r1.gguf").write_bytes(r1.read_bytes())
        out = cli.run("run", "default", "Weather in Paris as JSON", "--format", str(schema),
                      *GREEDY, "--max-tokens", "80")
        assert out.returncode == 0, out.stderr
        jsonschema.validate(json.loads(out.stdout), PARAMS)
        cut = cli.run("run", "default", "Weather in Paris as JSON", "--format", "json",
                      *GREEDY, "--max-tokens", "3")
        # a reply cut before its JSON closes is printed, said to be cut, and fails its schema
        assert cut.returncode == 15 and "cut at the token limit" in cut.stderr
        assert "not complete JSON" in cut.stderr
        bad = cli.run("run", "default", "x", "--format", str(tmp_path / "missing.json"))
        assert bad.returncode == 2 and "--format" in bad.stderr
        thinking = cli.json("run", "r1", "Weather?", *GREEDY, "--max-tokens", "12", "--think")
        assert thinking["text"] == ""  # the whole reply was thinking: R1's prompt opened it
        plain = cli.run("run", "r1", "Weather?", *GREEDY, "--max-tokens", "12")
        assert plain.returncode == 0 and plain.stdout.strip() == ""

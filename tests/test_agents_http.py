"""Agents' requests through the HTTP front door, with the official ``openai`` and ``ollama``
clients against a real daemon: structured output (validated with a JSON Schema library),
forced tool calls (streamed and not), sampling fields honoured, unsupported fields refused by
name, a bad schema refused before any runner sees it. The default model (Gemma 3 270M, a base
model with no chat template) takes every one: grammars make its replies parse."""

from __future__ import annotations

import json
import shlex
from typing import Any

import httpx
import jsonschema
import openai
import pytest

import test_http
from test_http import ROOT, Served

CITY = {"type": "object", "additionalProperties": False, "required": ["city", "population"],
        "properties": {"city": {"type": "string", "maxLength": 40},
                       "population": {"type": "integer", "minimum": 0}}}  # fmt: skip
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city", "unit"], "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}  # fmt: skip
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "required": ["zone"],
                   "properties": {"zone": {"type": "string", "maxLength": 30}}}}}  # fmt: skip
served = test_http.served  # the fixture: a daemon with HTTP on a free loopback port
ASK = [{"role": "user", "content": "What is the largest city of France? Answer in JSON."}]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_openai_response_format_json_schema(served: Served, temperature: float) -> None:
    r = served.openai.chat.completions.create(
        model="default", messages=ASK, temperature=temperature, seed=3, max_tokens=80,  # type: ignore[arg-type]
        response_format={"type": "json_schema",
                         "json_schema": {"name": "city", "schema": CITY, "strict": True}})
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text
    jsonschema.validate(json.loads(text or ""), CITY)
    if temperature:  # any object: a greedy base model writes ever longer keys until max_tokens
        # a seed whose draw ends the object (with modeld.schema's grammar seeds 1, 2, 4-7 do;
        # 3 rambled on for 200 tokens: a draw, not a grammar that cannot end)
        r = served.openai.chat.completions.create(
            model="default", messages=ASK, temperature=temperature, max_tokens=200, seed=1,  # type: ignore[arg-type]
            response_format={"type": "json_object"})
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        assert isinstance(json.loads(r.choices[0].message.content or ""), dict)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_ollama_format_schema_and_json(served: Served, temperature: float) -> None:
    opts = {"temperature": temperature, "num_predict": 80, "seed": 5}
    r = served.ollama.chat(model="default", messages=ASK, format=CITY, options=opts)
    jsonschema.validate(json.loads(r.message.content or ""), CITY)
    # streamed: the pieces add up to a reply that validates too
    pieces = [p.message.content or "" for p in
              served.ollama.chat(model="default", messages=ASK, format=CITY, options=opts,
                                 stream=True)]  # fmt: skip
    jsonschema.validate(json.loads("".join(pieces)), CITY)
    if temperature:  # as above: "json" is any object, which a greedy base model never ends
        # seed 1: a draw that ends the object with modeld.schema's grammar (5 rambled on)
        g = served.ollama.generate(model="default", prompt="Describe Paris.", format="json",
                                   options={**opts, "num_predict": 200, "seed": 1})  # fmt: skip
        assert g.done_reason == "stop"
        assert isinstance(json.loads(g.response), dict)


def _arguments_valid(name: str, arguments: str) -> dict[str, Any]:
    tool = {"get_weather": WEATHER, "get_time": TIME}[name]
    args = json.loads(arguments)
    jsonschema.validate(args, tool["function"]["parameters"])  # type: ignore[index]
    return dict(args)


@pytest.mark.parametrize("choice", ["named", "required"])
def test_openai_forced_tool_call_streamed_and_not(served: Served, choice: str) -> None:
    tool_choice: Any = ({"type": "function", "function": {"name": "get_weather"}}
                        if choice == "named" else "required")
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw: Any = dict(model="default", messages=ask, tools=[WEATHER, TIME],
                   tool_choice=tool_choice, temperature=0, max_tokens=80)
    r = served.openai.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    if choice == "named":
        assert call.function.name == "get_weather"
    _arguments_valid(call.function.name, call.function.arguments)
    # streamed: index/id/name once, then argument fragments that concatenate to valid JSON
    deltas = [c.choices[0] for c in served.openai.chat.completions.create(**kw, stream=True)]
    calls = [tc for d in deltas for tc in (d.delta.tool_calls or [])]
    assert calls and calls[0].id and calls[0].function and calls[0].function.name
    assert all(tc.index == 0 for tc in calls) and all(tc.id is None for tc in calls[1:])
    assert len(calls) > 2, "arguments arrive in pieces as they are generated, not in one block"
    args = "".join((tc.function.arguments or "") for tc in calls if tc.function)
    assert json.loads(args) == json.loads(call.function.arguments)  # greedy: same call
    assert deltas[-1].finish_reason == "tool_calls"
    # the tool's result goes back into the next turn's prompt
    history = [*ask, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]  # fmt: skip
    again = served.openai.chat.completions.create(model="default", messages=history,  # type: ignore[arg-type]
                                                  tools=[WEATHER, TIME], max_tokens=8,
                                                  temperature=0)
    assert (again.usage and r.usage and again.usage.prompt_tokens > r.usage.prompt_tokens)


def test_ollama_tool_calls_come_whole_with_object_arguments(served: Served) -> None:
    """Ollama's stream carries each call whole, its arguments an object; ``tool_choice``
    (modeld's extension of /api/chat) forces one on the default model."""
    ask = [{"role": "user", "content": "What time is it in Tokyo?"}]
    body = {"model": "default", "messages": ask, "tools": [TIME], "tool_choice": "required",
            "options": {"temperature": 0, "num_predict": 60}}
    with httpx.stream("POST", f"{served.base}/api/chat", json=body, timeout=120) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line.strip()]
    with_calls = [ln for ln in lines if ln["message"].get("tool_calls")]
    assert len(with_calls) == 1 and lines[-1]["done"] is True
    (call,) = with_calls[0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_time"
    jsonschema.validate(call["function"]["arguments"], TIME["function"]["parameters"])  # type: ignore[index]
    # the official client: auto tools on a model that may answer in text or call
    r2 = served.ollama.chat(model="default", messages=ask, tools=[TIME],  # type: ignore[list-item]
                            options={"temperature": 0, "num_predict": 30})
    assert r2.done and (r2.message.content is not None or r2.message.tool_calls)
    # and a tool result round-trips into the next prompt (tool_name, arguments as object)
    history = [*ask, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_name": "get_time", "content": "09:00"}]
    r3 = served.ollama.chat(model="default", messages=history, tools=[TIME],  # type: ignore[list-item]
                            options={"temperature": 0, "num_predict": 4})
    assert r3.prompt_eval_count and r2.prompt_eval_count
    assert r3.prompt_eval_count > r2.prompt_eval_count


def test_bad_schema_is_a_400_and_the_runner_lives_on(served: Served) -> None:
    good = served.openai.chat.completions.create(model="default", messages=ASK,  # type: ignore[arg-type]
                                                 max_tokens=4, temperature=0)
    pid = {r["runner_pid"] for r in served.d.client().ps()}
    bad_schemas = [
        {"type": "integer", "minimum": 5, "maximum": 2},  # no integer fits
        {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
        {"type": "array", "prefixItems": [{}, {}], "maxItems": 1},  # contradicts itself
        {"type": "wizard"},
    ]
    for schema in bad_schemas:
        with pytest.raises(openai.BadRequestError) as info:
            served.openai.chat.completions.create(
                model="default", messages=ASK, max_tokens=4,  # type: ignore[arg-type]
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": schema}})
        assert "format" in str(info.value), schema
    contradiction = {"type": "string", "minLength": 3, "maxLength": 1}
    r = httpx.post(f"{served.base}/api/chat", json={"model": "default", "messages": ASK,
                   "format": contradiction, "stream": False}, timeout=60)
    assert r.status_code == 400 and "format" in r.json()["error"]
    again = served.openai.chat.completions.create(model="default", messages=ASK,  # type: ignore[arg-type]
                                                  max_tokens=4, temperature=0)
    assert again.choices[0].message.content == good.choices[0].message.content
    assert {r["runner_pid"] for r in served.d.client().ps()} == pid  # the same runner


def test_sampling_fields_are_honoured(served: Served) -> None:
    ask = [{"role": "user", "content": "Count: one, two, three, four, five, six"}]
    base: Any = dict(model="default", messages=ask, temperature=0, max_tokens=40)
    plain = served.openai.chat.completions.create(**base).choices[0].message.content
    penalised = served.openai.chat.completions.create(
        **base, frequency_penalty=2.0, presence_penalty=2.0).choices[0].message.content
    assert penalised != plain
    r = served.openai.chat.completions.create(**{**base, "max_tokens": 6}, logprobs=True,
                                              top_logprobs=3)  # fmt: skip
    entries = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert entries and len(entries) <= 6
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5
    # the tokens are the reply (less the space after "Answer:" that the QA format strips)
    assert "".join(e.token for e in entries).lstrip() == r.choices[0].message.content
    ol = served.ollama.chat(model="default", messages=ask,
                            options={"temperature": 0, "num_predict": 40, "repeat_penalty": 1.8,
                                     "min_p": 0.1, "repeat_last_n": 32})  # fmt: skip
    assert ol.message.content != plain


REFUSED_OPENAI: list[tuple[dict[str, Any], str]] = [
    ({"n": 2}, "'n'"),
    ({"logit_bias": {"1": 5}}, "logit_bias"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, "image"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": 5}]}, "content"),
    ({"messages": [{"role": "user", "content": None}]}, "content"),
    ({"messages": [{"content": "x"}]}, "role"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "format"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [WEATHER]},
     "tool_choice"),
    ({"top_logprobs": 2}, "logprobs"),
    ({"mystery_field": 1}, "mystery_field"),
]


@pytest.mark.parametrize(("extra", "needle"), REFUSED_OPENAI)
def test_openai_fields_not_implemented_are_refused_by_name(
        served: Served, extra: dict[str, Any], needle: str) -> None:
    body = {"model": "default", "messages": ASK, "max_tokens": 2, **extra}
    r = httpx.post(f"{served.base}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    comp = httpx.post(f"{served.base}/v1/completions", timeout=60,
                      json={"model": "default", "prompt": "a", "suffix": "b"})  # fmt: skip
    assert comp.status_code == 400 and "suffix" in comp.json()["error"]["message"]


REFUSED_OLLAMA: list[tuple[dict[str, Any], str]] = [
    ({"images": ["AAAA"]}, "images"),
    ({"messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]}, "images"),
    ({"options": {"mirostat": 2}}, "mirostat"),
    ({"options": {"num_predict": 0}}, "num_predict"),
    ({"think": True}, "think"),  # the default model does not think
    ({"format": "yaml"}, "format"),
    ({"template": "{{ .Prompt }}"}, "template"),
    ({"messages": [{"role": "user", "content": None}]}, "content"),
]


@pytest.mark.parametrize(("extra", "needle"), REFUSED_OLLAMA)
def test_ollama_fields_not_implemented_are_refused_by_name(
        served: Served, extra: dict[str, Any], needle: str) -> None:
    body = {"model": "default", "messages": ASK, "stream": False, **extra}
    r = httpx.post(f"{served.base}/api/chat", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]
    gen = httpx.post(f"{served.base}/api/generate", timeout=60,
                     json={"model": "default", "prompt": "a", "suffix": "b"})  # fmt: skip
    assert gen.status_code == 400 and "suffix" in gen.json()["error"]


def test_show_reports_capabilities(served: Served) -> None:
    caps = served.ollama.show("default").capabilities or []
    assert "completion" in caps and "tools" in caps
    assert "thinking" not in caps and "vision" not in caps


def test_readme_structured_output_examples(served: Served) -> None:
    """Every ``curl`` of the README's "Structured output and tools" section, replayed: each
    answers 200 and its reply is what the section says (JSON that validates, a tool call)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Structured output and tools", 1)[1].split("\n## ", 1)[0]
    commands = [" ".join(block.split("\\\n")) for block in section.split("```sh", 1)[1]
                .split("```", 1)[0].strip().split("\n\n")]  # fmt: skip
    commands = [c for c in commands if c.startswith("curl ")]
    assert len(commands) >= 3
    for command in commands:
        args = shlex.split(command.replace("11434", str(served.port)))
        url = next(a for a in args if a.startswith("http"))
        r = httpx.post(url, content=args[args.index("-d") + 1], timeout=120)
        assert r.status_code == 200, (command, r.text[:300])
        doc = r.json()
        if "choices" in doc:
            msg = doc["choices"][0]["message"]
            if msg.get("tool_calls"):
                json.loads(msg["tool_calls"][0]["function"]["arguments"])
            else:
                json.loads(msg["content"])
        else:
            json.loads(doc["message"]["content"])


def test_constrained_replies_hold_batched_and_from_the_prompt_cache(served: Served) -> None:
    """A grammar per sequence: four sampled constrained requests decoded together each
    validate; a greedy one repeated is an exact prompt-cache hit (its first token sampled from
    the stored logits row) and gives the same valid reply."""
    from concurrent.futures import ThreadPoolExecutor

    client = served.d.client()
    msgs = [{"role": "user", "content": "Name a big city and its population, in JSON."}]

    def one(seed: int) -> tuple[str, dict[str, Any]]:
        c = served.d.client()
        gen = c.chat(None, msgs, format=CITY, temperature=0.9, seed=seed, max_tokens=80)
        text = gen.text()
        return text, dict(gen.done or {})

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4)))
    for text, _ in results:
        jsonschema.validate(json.loads(text), CITY)
    assert max(int(d["timings"]["batched_max"]) for _, d in results) > 1  # really together
    first = client.chat(None, msgs, format=CITY, temperature=0, max_tokens=80)
    a = first.text()
    second = client.chat(None, msgs, format=CITY, temperature=0, max_tokens=80)
    b = second.text()
    assert a == b and json.loads(a)
    done = second.done or {}
    assert done["usage"]["prompt_tokens_reused"] == done["usage"]["prompt_tokens"]

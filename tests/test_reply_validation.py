"""Issue 35, finding 6: a reply held to a JSON Schema is validated against the whole schema
once complete, and every API says the result (``validation``) in a way its official client
takes. A real daemon, real runners and the tiny generated chat model; the schemas are chosen so
the result does not depend on what the model writes:

- ``TWICE``: an array of exactly two elements, each the constant "a", with ``uniqueItems``:
  the grammar can only write ``["a","a"]`` (it cannot keep elements distinct), so the reply
  always fails ``uniqueItems``;
- ``SHORT_IP``: an ``ipv4`` string of at most two characters: the grammar holds the length, the
  format (validated only) can never be met;
- ``DIGIT``: an object whose one member is an integer 0-9: the grammar holds all of it, so the
  reply is valid (when not cut);
- a ``date`` (a format with a grammar): its shape always holds, its calendar is checked after.
"""

from __future__ import annotations

import calendar
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from test_http import Served, start_served

TWICE = {"type": "array", "items": {"enum": ["a"]}, "minItems": 2, "maxItems": 2,
         "uniqueItems": True}
SHORT_IP = {"type": "string", "format": "ipv4", "maxLength": 2}
DIGIT = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
         "required": ["n"], "additionalProperties": False}
ASK = [{"role": "user", "content": "answer"}]
GREEDY = {"temperature": 0, "seed": 1}


@pytest.fixture()
def served(daemon_factory: Callable[..., Any], tiny_chat_model: Path) -> Iterator[Served]:
    yield start_served(daemon_factory, tiny_chat_model)


def _post(s: Served, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{s.base}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _sse(s: Served, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = httpx.post(f"{s.base}{path}", json={**body, "stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines()
            if line.startswith("data: {")]


def _fails(validation: dict[str, Any], keyword: str, at: str = "") -> None:
    assert validation["valid"] is False, validation
    assert any(e["keyword"] == keyword and e["at"] == at for e in validation["errors"]), \
        validation


def test_ollama_says_how_the_reply_fails(served: Served) -> None:
    """/api/chat and /api/generate, whole and streamed (the last record carries it)."""
    chat = _post(served, "/api/chat", {"model": "tiny", "messages": ASK, "stream": False,
                                       "format": TWICE, "options": GREEDY})
    assert json.loads(chat["message"]["content"]) == ["a", "a"]
    _fails(chat["validation"], "uniqueItems")
    r = httpx.post(f"{served.base}/api/generate", timeout=120, json={
        "model": "tiny", "prompt": "ip?", "format": SHORT_IP, "options": GREEDY})
    records = [json.loads(line) for line in r.text.splitlines()]
    assert records[-1]["done"] and "validation" not in records[0]
    _fails(records[-1]["validation"], "format")
    assert "is not a valid ipv4" in records[-1]["validation"]["errors"][0]["message"]
    valid = _post(served, "/api/chat", {"model": "tiny", "messages": ASK, "stream": False,
                                        "format": DIGIT, "options": GREEDY})
    assert valid["validation"] == {"valid": True, "errors": [], "unchecked": []}
    # the official client takes such replies (its models drop fields they do not know)
    typed = served.ollama.chat(model="tiny", messages=ASK, format=TWICE, options=GREEDY)
    assert typed.done and json.loads(typed.message.content or "") == ["a", "a"]


def test_a_format_with_a_grammar_is_held_and_its_calendar_checked(served: Served) -> None:
    """``date``: the grammar holds the shape whatever the model writes; the validation
    after says whether the calendar has that day (the grammar lets 02-31 through)."""
    for seed in (1, 2, 3):
        body = _post(served, "/api/generate", {
            "model": "tiny", "prompt": "a date", "stream": False,
            "format": {"type": "string", "format": "date"},
            "options": {"temperature": 1.0, "seed": seed, "num_predict": 40}})
        text = json.loads(body["response"])
        m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", text)
        assert m, text
        year, month, day = map(int, m.groups())
        real = 1 <= month <= 12 and 1 <= day <= calendar.monthrange(year or 2000, month)[1] \
            if year else 1 <= month <= 12 and 1 <= day <= (29 if month == 2 else
                                                           calendar.mdays[month])
        assert body["validation"]["valid"] is real, (text, body["validation"])


def test_openai_chat_and_completions_carry_it_on_the_choice(served: Served) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": TWICE}}
    whole = served.openai.chat.completions.create(model="tiny", messages=ASK,  # type: ignore
                                                  response_format=fmt, temperature=0, seed=1)
    extra = whole.choices[0].model_extra or {}
    _fails(extra["validation"], "uniqueItems")
    chunks = _sse(served, "/v1/chat/completions", {"model": "tiny", "messages": ASK,
                                                   "response_format": fmt, **GREEDY})
    last = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(last) == 1 and all("validation" not in c["choices"][0] for c in chunks
                                  if c is not last[0])
    _fails(last[0]["choices"][0]["validation"], "uniqueItems")
    ok = _post(served, "/v1/chat/completions", {
        "model": "tiny", "messages": ASK, **GREEDY,
        "response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": DIGIT}}})
    assert ok["choices"][0]["validation"]["valid"] is True
    # a reply cut by max_tokens is not complete JSON, and says so
    cut = _post(served, "/v1/chat/completions", {"model": "tiny", "messages": ASK, **GREEDY,
                                                 "max_tokens": 2, "response_format": fmt})
    problem = cut["choices"][0]["validation"]["errors"][0]
    assert cut["choices"][0]["finish_reason"] == "length", cut
    assert "not complete JSON (cut at the max_tokens limit)" in problem["message"], problem


def test_responses_carry_it_on_the_response(served: Served) -> None:
    text = {"format": {"type": "json_schema", "name": "ip", "schema": SHORT_IP}}
    whole = _post(served, "/v1/responses", {"model": "tiny", "input": "ip?", "text": text,
                                            "temperature": 0})
    _fails(whole["validation"], "format")
    r = httpx.post(f"{served.base}/v1/responses", timeout=120, json={
        "model": "tiny", "input": "ip?", "text": text, "stream": True, "temperature": 0})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    completed = [e for e in events if e["type"] == "response.completed"]
    assert len(completed) == 1
    _fails(completed[0]["response"]["validation"], "format")


def test_anthropic_structured_output_and_forced_tool_calls(served: Served) -> None:
    """``output_config.format`` and a forced tool call whose ``input_schema`` has
    ``uniqueItems`` (pydantic's ``set[...]``): the message, or the stream's message_delta."""
    c = anthropic.Anthropic(base_url=served.base, api_key="unused", timeout=120, max_retries=0)
    msg = c.messages.create(model="tiny", max_tokens=64, messages=ASK,  # type: ignore[call-overload]
                            extra_body={**GREEDY, "output_config": {"format": {
                                "type": "json_schema", "schema": SHORT_IP}}})
    _fails((msg.model_extra or {})["validation"], "format")
    tool = {"name": "tag", "description": "tags", "input_schema": {
        "type": "object", "properties": {"tags": TWICE}, "required": ["tags"]}}
    forced = c.messages.create(model="tiny", max_tokens=64, messages=ASK,  # type: ignore
                               tools=[tool], tool_choice={"type": "tool", "name": "tag"},
                               extra_body=GREEDY)
    assert forced.content[-1].type == "tool_use"
    assert forced.content[-1].input == {"tags": ["a", "a"]}  # type: ignore[union-attr]
    _fails((forced.model_extra or {})["validation"], "uniqueItems",
           at="/tool_calls/0/arguments/tags")
    with c.messages.stream(model="tiny", max_tokens=64, messages=ASK,  # type: ignore
                           tools=[tool], tool_choice={"type": "tool", "name": "tag"},
                           extra_body=GREEDY) as s:
        deltas = [e for e in s if e.type == "message_delta"]
    assert len(deltas) == 1
    _fails((deltas[0].delta.model_extra or {})["validation"], "uniqueItems",
           at="/tool_calls/0/arguments/tags")


def test_run_format_exits_15_and_says_why(served: Served, tmp_path: Path) -> None:
    """``modeld run --format``: the reply on stdout as always, the failure on stderr, exit
    code 15 (INVALID_REPLY); a valid reply exits 0."""
    bad, good = tmp_path / "twice.json", tmp_path / "digit.json"
    bad.write_text(json.dumps(TWICE))
    good.write_text(json.dumps(DIGIT))
    env = served.d.env
    run = [sys.executable, "-m", "modeld", "run", "tiny", "answer", "--temperature", "0"]
    p = subprocess.run([*run, "--format", str(bad)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 15, (p.returncode, p.stderr)
    assert json.loads(p.stdout) == ["a", "a"]
    assert "does not validate against the schema" in p.stderr
    assert "uniqueItems" in p.stderr and "elements 0 and 1 are equal" in p.stderr
    p = subprocess.run([*run, "--format", str(good), "--json"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["done"]["validation"]["valid"] is True

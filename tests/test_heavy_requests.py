"""Issue 35, items 3-8, against a real daemon behind the HTTP front door: each heavy or hostile
request gets its clear answer while a stream beside it on the same model keeps going, and the
daemon's memory comes back to its level.

The pace bound. The issue asks for no gap over 0.5 s; these tests run on a 2-core machine
shared with other developers' test runs (load averages of 8 are common), where a gemma-3-270m
stream alone shows gaps of a second or two now and then. So a test fails only past
:data:`GAP_BOUND` (8 s): no false alarm under that load, and still far below what the bugs
did at the sizes used here (the issue measured 9-55 s of frozen streams for them). The real
gaps are measured on a quiet machine by bench/b_heavy.py (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from daemonutil import until
from test_http import Served, start_served

GAP_BOUND = 8.0
#: What the daemon may keep after the heavy requests (the bugs kept 973 MB).
MEMORY_SLACK = 150 * 2**20
NEIGHBOUR = {"model": "default", "prompt": "Write a long story about a lighthouse keeper.",
             "raw": True, "options": {"num_predict": 160, "temperature": 1.0, "seed": 7}}


@pytest.fixture()
def heavy(daemon_factory: Callable[..., Any], tiny_chat_model: Path) -> Iterator[Served]:
    """A daemon with HTTP whose models decode two sequences together (the heavy request
    shares the neighbour's batch), the tiny chat model as ``tiny``."""
    yield start_served(daemon_factory, tiny_chat_model, "--parallel", "2")


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


class Neighbour:
    """A sampled stream on the default model, its lines' arrival times kept."""

    def __init__(self, base: str) -> None:
        self.base, self.times, self.lines = base, [], []  # type: ignore[var-annotated]
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with httpx.stream("POST", f"{self.base}/api/generate", json=NEIGHBOUR,
                          timeout=300) as r:  # fmt: skip
            for line in r.iter_lines():
                if line:
                    self.times.append(time.monotonic())
                    self.lines.append(json.loads(line))

    def __enter__(self) -> Neighbour:
        self.thread.start()
        until(lambda: len(self.times) >= 2, timeout=180, what="the neighbour's first tokens")
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(300)

    def check(self) -> float:
        """The longest gap between its lines; it must have ended normally."""
        assert not self.thread.is_alive()
        assert self.lines and self.lines[-1].get("done") is True, self.lines[-1:]
        assert not any("error" in line for line in self.lines)
        gaps = [b - a for a, b in zip(self.times, self.times[1:], strict=False)]
        worst = max(gaps, default=0.0)
        assert worst < GAP_BOUND, f"the neighbour stream stalled {worst:.1f} s"
        return worst


def _post(s: Served, route: str, body: Any, timeout: float = 120) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{s.base}{route}", content=data, timeout=timeout,
                      headers={"content-type": "application/json"})


def _warm(s: Served) -> int:
    """Load the default model and return the daemon's resident memory then."""
    ok = _post(s, "/api/generate", {"model": "default", "prompt": "hi", "stream": False,
                                     "options": {"num_predict": 1}})  # fmt: skip
    assert ok.status_code == 200, ok.text
    return _rss(s.d.proc.pid)


def test_repetition_bounds_are_refused_at_once_off_the_loop(heavy: Served) -> None:
    """Item 3: minItems 10^8 and a{10^9} are 400s naming the bound, fast; ps answers while
    they are refused; nothing stays in memory."""
    before = _warm(heavy)
    bad = [{"type": "array", "items": {"type": "integer"}, "minItems": 100_000_000},
           {"type": "string", "pattern": "^a{1000000000}$"},
           {"type": "array", "items": {"type": "array", "items": {}, "minItems": 2000},
            "minItems": 2000, "maxItems": 2000}]
    with Neighbour(heavy.base) as n:
        for schema in bad:
            t0 = time.monotonic()
            r = _post(heavy, "/v1/chat/completions", {
                "model": "default", "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 8, "temperature": 1.0, "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "x", "schema": schema}}})
            assert time.monotonic() - t0 < 30
            if r.status_code == 400:
                assert "over 2000" in r.text or "repeats" in r.text, r.text
            else:  # 2000 x 2000 by reference: bounded, so it is a grammar (answered 200)
                assert r.status_code == 200, r.text
            assert heavy.d.client().ps() is not None
    n.check()
    assert _rss(heavy.d.proc.pid) - before < MEMORY_SLACK


def test_a_50000_word_enum_shares_the_batch_without_stalling_it(heavy: Served) -> None:
    """Item 4: the enum is a prefix tree: the reply is one of the words, the stream beside
    it keeps its pace."""
    before = _warm(heavy)
    words = [f"w{i:05d}x" for i in range(50_000)]
    with Neighbour(heavy.base) as n:
        r = _post(heavy, "/api/generate", {
            "model": "default", "prompt": "Pick a word.", "stream": False, "format": {
                "enum": words}, "options": {"num_predict": 12, "temperature": 1.0, "seed": 2}},
            timeout=300)
        assert r.status_code == 200, r.text
        reply = r.json()
        if reply["done_reason"] == "stop":
            assert json.loads(reply["response"]) in words
    n.check()
    assert _rss(heavy.d.proc.pid) - before < MEMORY_SLACK


def test_a_huge_prompt_is_refused_from_its_bytes_and_counted_off_the_loop(heavy: Served) -> None:
    """Item 5: 10 MB of Responses instructions is a context error at once (no tokenizing);
    count_tokens of 2 MB is counted on the tokenizer thread while the neighbour streams."""
    before = _warm(heavy)
    with Neighbour(heavy.base) as n:
        t0 = time.monotonic()
        r = _post(heavy, "/v1/responses", {"model": "default", "input": "hi",
                                           "instructions": "hello world " * 870_000})
        assert r.status_code == 400 and "at least" in r.text and "tokens" in r.text, r.text
        assert time.monotonic() - t0 < 60
        long_text = "hello world " * 170_000
        r = _post(heavy, "/v1/messages/count_tokens", {
            "model": "default", "messages": [{"role": "user", "content": long_text}]},
            timeout=300)
        assert r.status_code == 200 and r.json()["input_tokens"] > 300_000, r.text
    n.check()
    assert _rss(heavy.d.proc.pid) - before < MEMORY_SLACK


def test_a_big_body_leaves_no_copy_resident(heavy: Served) -> None:
    """glibc's adjustable mmap threshold kept a 10 MB body's copies in the daemon's heaps (it
    kept 29 MiB after one, 0 once the threshold is fixed: probe.map_big_allocations). The
    bound leaves room for the daemon's own growth (a few MiB) but not for one copy of the
    body's text."""
    before = _warm(heavy)
    r = _post(heavy, "/v1/responses", {"model": "default", "input": "hi",
                                       "instructions": "hello world " * 870_000})
    assert r.status_code == 400, r.text
    time.sleep(0.5)  # the daemon's loop has forwarded the answer; let it drop its copies
    grew = _rss(heavy.d.proc.pid) - before
    assert grew < 8 * 2**20, f"the daemon kept {grew / 2**20:.1f} MiB after a 10 MB body"


def test_keywords_are_enforced_or_refused_with_their_path(heavy: Served) -> None:
    """Item 6: maximum holds; what changes what must be written is a 400 naming keyword and
    path (uniqueItems, multipleOf, formats: validated after, tests/test_reply_validation.py)."""
    schema = {"type": "object", "properties": {"year": {"type": "integer", "maximum": 5}},
              "required": ["year"]}
    r = _post(heavy, "/api/chat", {"model": "tiny", "stream": False, "format": schema,
                                   "messages": [{"role": "user", "content": "year?"}],
                                   "options": {"num_predict": 40, "temperature": 1.0}})
    assert r.status_code == 200, r.text
    if r.json()["done_reason"] == "stop":
        jsonschema.validate(json.loads(r.json()["message"]["content"]), schema)
    for keyword, value in [("not", {}), ("dependentSchemas", {}), ("if", {}),
                           ("nullable", True), ("contains", {}), ("dependentRequired", {})]:
        bad = {"type": "object", "properties": {"a": {keyword: value}}}
        r = _post(heavy, "/api/chat", {"model": "tiny", "format": bad,
                                       "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and f"'{keyword}'" in r.text, r.text
        assert f"#/properties/a/{keyword}" in r.text


def test_valid_schemas_get_their_grammar_or_the_real_reason(heavy: Served) -> None:
    """Item 7: quotes in a const, an enum value and a member name (a tool name is refused, by
    its rule: issue 45); a recursive $ref at the root; 2,000 optional members refused for
    what they cost."""
    ask = [{"role": "user", "content": "x"}]
    ok = [{"enum": ['he said "x"', "b"]}, {"const": 'a"b'},
          {"type": "object", "properties": {'q"k': {"type": "string"}}, "required": ['q"k']},
          {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
           "$ref": "#/$defs/n"}]
    for schema in ok:
        r = _post(heavy, "/api/chat", {"model": "tiny", "stream": False, "format": schema,
                                       "messages": ask, "options": {"num_predict": 8}})
        assert r.status_code == 200, (schema, r.text)
    tool = {"type": "function", "function": {"name": 'say"hi', "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}
    r = _post(heavy, "/v1/chat/completions", {"model": "tiny", "messages": ask, "tools": [tool],
                                              "tool_choice": "required", "max_tokens": 8})
    # issue 45: a tool name is letters, digits, _ - . : (OpenAI's rule, Anthropic's length)
    assert r.status_code == 400 and "tools[0].name must be" in r.text, r.text
    flat = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}
    r = _post(heavy, "/api/chat", {"model": "tiny", "format": flat, "messages": ask})
    assert r.status_code == 400 and "2000 optional members" in r.text, r.text


DEEP = "[" * 100_000 + "]" * 100_000


def _deep_schema(levels: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        doc = {"type": "object", "properties": {"a": doc}}
    return doc


def test_deep_json_is_a_400_on_every_route(heavy: Served, tmp_path: Path) -> None:
    """Item 8: 100,000 nested arrays in a body, or tool parameters 600 levels deep, on each
    API and the CLI's --format file: a 400 (CLI: exit 2) naming the depth limit."""
    deep_tool = json.dumps(_deep_schema(300))  # 600 JSON levels
    bodies = {route: body.replace("DEEP", DEEP).replace("TOOL", deep_tool) for route, body in {
        "/api/generate": '{"model": "tiny", "prompt": "x", "format": DEEP}',
        "/api/chat": '{"model": "tiny", "messages": [], "format": DEEP}',
        "/v1/chat/completions": '{"model": "tiny", "messages": [{"role": "user", "content": '
                                '"x"}], "tools": [{"type": "function", "function": {"name": '
                                '"f", "parameters": TOOL}}]}',
        "/v1/completions": '{"model": "tiny", "prompt": "x", "stop": DEEP}',
        "/v1/responses": '{"model": "tiny", "input": "x", "tools": [{"type": "function", '
                         '"name": "f", "parameters": TOOL}]}',
        "/v1/messages": '{"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", '
                        '"content": "x"}], "tools": [{"name": "f", "input_schema": TOOL}]}',
        "/v1/messages/count_tokens": '{"model": "tiny", "messages": DEEP}',
    }.items()}
    for route, body in bodies.items():
        r = _post(heavy, route, body.encode())
        assert r.status_code == 400, (route, r.status_code, r.text[:300])
        assert "deeper than 64 levels" in r.text, (route, r.text[:300])
    schema_file = tmp_path / "deep.json"
    schema_file.write_text(DEEP)
    env = dict(heavy.d.env, MODELD_NO_AUTOSTART="1")
    cli = subprocess.run([sys.executable, "-m", "modeld", "run", "tiny", "x", "--format",
                          str(schema_file)], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert cli.returncode == 2 and "deeper than 64 levels" in cli.stderr, cli.stderr
    schema_file.write_text(deep_tool)
    cli = subprocess.run([sys.executable, "-m", "modeld", "run", "tiny", "x", "--format",
                          str(schema_file)], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert cli.returncode == 2 and "deeper than 64 levels" in cli.stderr, cli.stderr
    assert heavy.d.proc.poll() is None and "RecursionError" not in heavy.d.log_text()

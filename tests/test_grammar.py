"""modeld.daemon.grammar: what a reply must follow, built and checked before any runner sees it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from modeld.daemon import grammar
from modeld.errors import InvalidRequestError
from modeld.wire.messages import Tool

ROOT = Path(__file__).resolve().parent.parent
WEATHER = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}},
                                    "required": ["city"]})  # fmt: skip
CLOCK = Tool("get_time")


def test_free_text_has_no_grammar_and_json_is_an_object() -> None:
    assert grammar.for_request(None, (), "auto") is None
    assert grammar.for_request(None, (WEATHER,), "auto") is None  # auto: parsed, not forced
    gbnf = grammar.for_request("json", (), "auto")
    assert gbnf is not None and 'root ::= object' in gbnf and 'integral-part' in gbnf


def test_a_schema_becomes_its_grammar() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    gbnf = grammar.for_request(schema, (), "auto")
    assert gbnf is not None and '"\\"n\\""' in gbnf


@pytest.mark.parametrize(("family", "before", "key"), [
    ("hermes", '"<tool_call>\\n"', '"\\"arguments\\""'),
    ("mistral", '"[TOOL_CALLS]["', '"\\"arguments\\""'),
    ("llama3", "", '"\\"parameters\\""'),
    ("generic", "", '"\\"arguments\\""'),
])
def test_forced_calls_are_written_in_the_family_syntax(family: str, before: str, key: str) -> None:
    gbnf = grammar.for_request(None, (WEATHER, CLOCK), "function:get_weather", family)
    assert gbnf is not None and key in gbnf and "get_weather" in gbnf and "get_time" not in gbnf
    root = next(line for line in gbnf.splitlines() if line.startswith("root ::="))
    assert root.startswith(f"root ::= {before}") if before else "forced-tool-call" not in gbnf
    both = grammar.for_request(None, (WEATHER, CLOCK), "required", family)
    assert both is not None and "get_weather" in both and "get_time" in both


@pytest.mark.parametrize(("schema", "needle"), [
    ({"type": "string", "pattern": "^(?=a)"}, "the pattern uses '(?'"),
    ({"properties": {"a": {"$ref": "https://example.com/x.json"}}},
     "is not local (at #/properties/a)"),
    ({"type": "wizard"}, "'wizard' is not a JSON type (at #)"),
    ({"type": "string", "minLength": 100000}, "over 2000"),  # crashed llama.cpp's parser
    ({"type": "array", "items": {"type": "integer"}, "minItems": 50_000_000}, "over 2000"),
])
def test_unusable_schemas_are_request_errors_naming_the_part(schema: dict[str, object],
                                                             needle: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        grammar.for_request(schema, (), "auto")
    assert info.value.message.startswith("format:") and needle in info.value.message
    bad_tool = Tool("f", "", {"type": "object", "properties": {"a": {"type": "wizard"}}})
    with pytest.raises(InvalidRequestError) as info2:
        grammar.for_request(None, (bad_tool,), "required")
    assert "parameters" in info2.value.message


def test_a_grammar_llama_cpp_rejects_says_why() -> None:
    with pytest.raises(InvalidRequestError) as info:
        grammar.check("root ::= undefined-rule", "format")
    assert "rejected" in info.value.message and "undefined-rule" in info.value.message
    with pytest.raises(InvalidRequestError, match="unexpected end"):
        grammar.check("root ::= [a-", "format")
    assert grammar.check('root ::= "x"', "format") == 'root ::= "x"'


def test_the_daemon_checks_grammars_without_importing_llama_cpp_or_numpy() -> None:
    """The daemon parses with libllama through ctypes: ``import llama_cpp`` brought numpy and
    its BLAS, 26 MiB the daemon kept after its first format (issue 35). The parser is the real
    one: a bad grammar still says why."""
    code = ("import sys; from modeld.daemon import grammar\n"
            "assert grammar.check('root ::= \"x\"', 'format') == 'root ::= \"x\"'\n"
            "try: grammar.check('root ::= undefined-rule', 'format')\n"
            "except Exception as e: print(e.message)\n"
            "print(sorted(m for m in ('numpy', 'llama_cpp') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    first, loaded = out.stdout.splitlines()[-2:]
    assert "rejected" in first and "undefined-rule" in first, out
    assert loaded == "[]", out


def test_format_and_tools_together_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="together"):
        grammar.for_request("json", (WEATHER,), "auto")
    assert grammar.for_request("json", (WEATHER,), "none") is not None


def test_nesting_ignores_literals_and_classes() -> None:
    assert grammar.nesting('root ::= "(((" [()] ( "x" ( "y" ) )') == 2
    assert grammar.nesting("root ::= x # (((\nx ::= (\"a\")") == 1


def test_the_deep_grammar_check_does_not_crash_a_process() -> None:
    """The check runs in the daemon: a schema that crashed llama.cpp's parser must fail as an
    error in a process that then goes on (checked in a child, so a crash is seen, not
    suffered)."""
    code = ("import json; from modeld.daemon import grammar\n"
            "for n in (100000, 1000000):\n"
            "    try: grammar.for_request({'type': 'string', 'minLength': n}, (), 'auto')\n"
            "    except Exception as e: print(type(e).__name__)\n"
            "    g = grammar.for_request({'type': 'string', 'maxLength': n}, (), 'auto')\n"
            "    print(len(g) < 1000)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(ROOT / "src")})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    # a maximum past 2000 is not repeated in the grammar (it is validated after)
    assert out.stdout.split() == ["InvalidRequestError", "True"] * 2
    assert json.dumps(grammar.tool_call_schema((CLOCK,), None))

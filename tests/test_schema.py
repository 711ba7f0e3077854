"""modeld.schema (issue 35): JSON Schemas become grammars that llama.cpp's own sampler holds
replies to, every count bounded before anything is built, every keyword enforced, annotated or
refused with its path. Texts are checked by a real llama.cpp grammar sampler, byte by byte."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from grammarutil import ByteMatcher
from modeld.daemon import grammar
from modeld.errors import InvalidRequestError
from modeld.schema import keywords, to_gbnf
from modeld.wire.messages import Tool


@pytest.fixture(scope="module")
def matcher(model_factory: Callable[..., Path]) -> ByteMatcher:
    import ggufgen

    return ByteMatcher(model_factory("llama", **ggufgen.TINY))


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _gbnf(schema: dict[str, Any]) -> str:
    gbnf = grammar.for_request(schema, (), "auto")
    assert gbnf is not None
    return gbnf


def test_integer_bounds_are_exact(matcher: ByteMatcher) -> None:
    """Item 6: maximum/minimum hold on integers (any width of range, no enumeration)."""
    for lo, hi in [(-37, 1234), (5, 5), (0, 9), (17, 342), (-1000, -10)]:
        gbnf = _gbnf({"type": "integer", "minimum": lo, "maximum": hi})
        wrong = [n for n in range(lo - 120, hi + 120)
                 if matcher.matches(gbnf, str(n)) != (lo <= n <= hi)]
        assert not wrong, (lo, hi, wrong[:5])
    year = _gbnf({"type": "object", "properties": {"year": {"type": "integer", "maximum": 5}},
                  "required": ["year"]})
    assert matcher.matches(year, '{"year":5}') and not matcher.matches(year, '{"year":1939}')
    big = _gbnf({"type": "integer", "exclusiveMinimum": 10**9})
    assert len(big) < 2000 and matcher.matches(big, str(10**9 + 1))
    assert not matcher.matches(big, str(10**9))


def test_number_bounds_with_whole_number_limits(matcher: ByteMatcher) -> None:
    gbnf = _gbnf({"type": "number", "minimum": -3, "exclusiveMaximum": 2})
    for text in ["-3", "-3.0", "-3.5", "-2.99", "0", "0.5", "1.999", "2", "2.0", "-0.25", "1e3"]:
        assert matcher.matches(gbnf, text) == (text != "1e3" and -3 <= float(text) < 2), text
    positive = _gbnf({"type": "number", "exclusiveMinimum": 0, "maximum": 1})
    for text in ["0", "0.0", "0.001", "1", "1.0", "1.5", "0.7"]:
        assert matcher.matches(positive, text) == (0 < float(text) <= 1), text
    # a fractional bound: the grammar holds the whole numbers around it (the reply is then
    # validated against the bound itself: tests/test_schema_validate.py)
    around = _gbnf({"type": "number", "exclusiveMinimum": -0.5, "maximum": 0.5})
    for text in ["-1", "-0.5", "0", "0.25", "0.5", "0.75", "1", "1.5", "-1.5"]:
        assert matcher.matches(around, text) == (-1 <= float(text) <= 1), text
    with pytest.raises(InvalidRequestError, match="no integer is within"):
        _gbnf({"type": "integer", "minimum": 3, "maximum": 2})


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "number", "minimum": 1e17}, "no number the grammar writes (16 digits at most)"),
    ({"type": "number", "maximum": -1e17}, "no number the grammar writes (16 digits at most)"),
    ({"type": "number", "minimum": "1"}, "must be a number (at #/minimum)"),
    ({"type": "integer", "exclusiveMaximum": float("inf")}, "must be a number"),
])
def test_number_bounds_past_the_limit_or_not_numbers_are_refused(
    schema: dict[str, Any], message: str
) -> None:
    """A bound past the 16 digits the grammar writes on its closed side leaves no number; a bound
    that is no finite number is refused with its path."""
    with pytest.raises(InvalidRequestError, match=re.escape(message)):
        to_gbnf(schema, "format", 1 << 20)


def test_draft4_exclusive_flags_and_open_side_limits() -> None:
    """Draft 4's ``exclusiveMinimum: true`` turns ``minimum`` exclusive; a bound past the limit
    on the open side leaves the limit in place (the grammar is then as without it)."""
    draft4 = to_gbnf({"type": "integer", "minimum": 5, "exclusiveMinimum": True}, "f", 1 << 20)
    assert draft4.gbnf == to_gbnf({"type": "integer", "minimum": 6}, "f", 1 << 20).gbnf
    far = to_gbnf({"type": "number", "maximum": 1e17, "minimum": 0}, "f", 1 << 20)
    assert far.gbnf == to_gbnf({"type": "number", "minimum": 0}, "f", 1 << 20).gbnf


@pytest.mark.parametrize(("schema", "good", "bad"), [
    ({"enum": ['he said "x"', "b", 1, None, {"a": [1]}, "back\\slash", "new\nline"]},
     ['he said "x"', "b", 1, None, {"a": [1]}, "back\\slash", "new\nline"], ["c", 2, "he said"]),
    ({"const": 'q"uote'}, ['q"uote'], ["quote"]),
    ({"type": "object", "properties": {'na"me': {"type": "string"}}, "required": ['na"me']},
     [{'na"me': "x"}], [{"name": "x"}]),
    ({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
      "additionalProperties": {"type": "integer"}},
     [{"a": "x"}, {"a": "x", "zz": 3}, {"zz": 3}, {"b": 1}, {"ab": 1}], [{"a": 3}, {"zz": "s"}]),
    ({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"},
     [[], [[]], [[], [[[]]]]], [[1], {}]),  # recursive, from the root
    ({"type": "array", "items": {"type": "string", "format": "date"}, "minItems": 1,
      "maxItems": 2}, [["2024-02-29"], ["2024-01-01", "2023-12-31"]],
     [[], ["2024-13-01"], ["2024-01-01"] * 3]),
    ({"type": "string", "pattern": "^[a-z]{2,3}(-\\d+)?\"\\n$"}, ['ab"\n', 'abc-12"\n'],
     ["a\"\n", 'ab-"\n', "ab"]),
    ({"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}], "items": False},
     [[True, None]], [[True], [True, None, None]]),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "string"}}}]}, [{"a": 1}, {"a": 1, "b": "x"}],
     [{"b": "x"}]),
    ({"type": ["string", "null"], "maxLength": 3}, ["abc", None], ["abcd", 3]),
    ({"anyOf": [{"const": "x"}, {"type": "integer", "minimum": 0}], "title": "t"},
     ["x", 0, 7], ["y", -1]),
    # held where the grammar can, the rest validated after (tests/test_schema_validate.py)
    ({"enum": [1, 2, 3, "x"], "minimum": 2}, [2, 3, "x"], [1]),  # the values that satisfy it
    ({"type": "object", "additionalProperties": {"type": "integer"},  # pydantic's dict[Literal]
      "propertyNames": {"enum": ["a", "b"]}}, [{}, {"a": 1}, {"b": 2, "a": 1}], [{"c": 1}]),
    ({"type": "object", "additionalProperties": {"type": "boolean"}, "minProperties": 1,
      "maxProperties": 2, "propertyNames": {"maxLength": 2}},
     [{"a": True}, {"ab": False, "b": True}], [{}, {"a": True, "b": True, "c": True},
                                               {"abc": True}, {"a": 1}]),
    ({"type": "string", "pattern": "^\\d+$", "maxLength": 3}, ["1", "123"], ["a", ""]),
    ({"type": "number", "multipleOf": 5}, [0, 10, -5], [1.5, "5"]),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [[], [1, 2]],
     [["a"]]),
    # a pattern is a search: an unanchored side may hold anything (pydantic's "^[A-Z]")
    ({"type": "string", "pattern": "^[A-Z]"}, ["A", "Abc", 'B"\n'], ["a", "", "aB"]),
    ({"type": "string", "pattern": "b+c"}, ["bc", 'x"bbc\\', "abcd"], ["cb", "b", ""]),
    ({"type": "string", "pattern": "x$"}, ["x", "ax"], ["xa", ""]),
    ({"type": "string", "pattern": "a\\$"}, ["a$", "za$b"], ["a", "za"]),
    ({"type": "string", "pattern": ""}, ["", "anything"], []),
    # keywords beside anyOf go into each alternative (zod's string().ip(): type beside anyOf)
    ({"type": "string", "anyOf": [{"maxLength": 1}, {"pattern": "^b+$"}, {"const": "cc"},
                                  {"const": 3}]}, ["a", "", "bbb", "cc"], [1, 3, "ab", "bbc"]),
])
def test_replies_follow_the_schema(matcher: ByteMatcher, schema: dict[str, Any], good: list[Any],
                                   bad: list[Any]) -> None:
    """Item 7 among them: a quote in a constant, an enum value or a member name, and a
    recursive $ref at the root, are grammars (they were refused for the wrong reason)."""
    gbnf = _gbnf(schema)
    for value in good:
        jsonschema.validate(value, schema)
        assert matcher.matches(gbnf, _text(value)), (value, gbnf)
    for value in bad:
        assert not matcher.matches(gbnf, _text(value)), (value, gbnf)


def test_random_replies_that_match_are_valid(matcher: ByteMatcher) -> None:
    """Soundness on a mixed schema: whatever the grammar lets through, jsonschema accepts."""
    schema = {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 99},
        "tag": {"enum": ["a", "bb", "ab"]},
        "xs": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    }, "required": ["id"]}
    gbnf = _gbnf(schema)
    rng = random.Random(3)
    matched = 0
    for _ in range(400):
        doc: dict[str, Any] = {"id": rng.choice([0, 1, 50, 99, 100, "1"])}
        if rng.random() < 0.5:
            doc["tag"] = rng.choice(["a", "bb", "ab", "b", ""])
        if rng.random() < 0.5:
            doc["xs"] = [rng.choice([True, False, 1]) for _ in range(rng.randint(0, 3))]
        if matcher.matches(gbnf, _text(doc)):
            matched += 1
            jsonschema.validate(doc, schema)
    assert matched > 20


def test_a_forced_call_to_a_tool_with_a_quote_in_its_name(matcher: ByteMatcher) -> None:
    tool = Tool('say "hi"', "", {"type": "object", "properties": {"q": {"type": "string"}},
                                 "required": ["q"]})
    gbnf = grammar.for_request(None, (tool,), "required")
    assert gbnf is not None
    assert matcher.matches(gbnf, _text({"name": 'say "hi"', "arguments": {"q": "x"}}))


@pytest.mark.parametrize(("schema", "needle"), [
    ({"properties": {"a": {"not": {}}}}, "'not' is not supported (at #/properties/a/not)"),
    ({"type": "integer", "multipleOf": 0}, "must be a number above 0 (at #/multipleOf)"),
    ({"type": "array", "uniqueItems": "yes"}, "must be true or false (at #/uniqueItems)"),
    ({"type": "object", "additionalProperties": {}, "propertyNames": {"$ref": "#"}},
     "propertyNames must be a string schema without $ref"),
    ({"enum": ["a", "b"], "pattern": "^a$"}, "'pattern' beside enum/const"),
    ({"enum": [1, 2], "minimum": 3}, "no enum/const value satisfies"),
    ({"type": "string", "anyOf": [{"$ref": "#/$defs/x"}], "$defs": {"x": {}}},
     "an alternative that is a $ref are not supported (at #/anyOf/0)"),
    ({"anyOf": [{}], "oneOf": [{}]}, "'oneOf' beside 'anyOf' is not supported"),
    ({"type": "string", "anyOf": [{"type": "integer"}]},
     "'type' both beside 'anyOf' and in an alternative is not supported (at #/anyOf/0/type)"),
    # issue 45: a grammar cannot keep a map's keys distinct (pydantic's dict[constr(...)])
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
     "the keyword 'patternProperties' is not supported (at #/patternProperties)"),
    ({"type": "object", "properties": {"a": {}}, "patternProperties": {"^b": {}}},
     "the keyword 'patternProperties' is not supported"),
    ({"type": "array", "contains": {}}, "'contains'"),
    ({"type": "object", "dependentRequired": {}}, "'dependentRequired'"),
    ({"type": "string", "nullable": True}, "OpenAPI keyword"),
    ({"$ref": "#/$defs/missing"}, "names nothing"),
    ({"type": "string", "pattern": "^a{1000000000}$"}, "repeats over 2000 times"),
    ({"type": "string", "pattern": "^(a{100}){100}$"}, "nested quantifiers multiply"),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(2000)}},
     "2000 optional members (at most 64"),
    ({"anyOf": [{"type": "array", "minItems": i} for i in range(100)]}, "100 alternatives"),
    ({"type": "string", "minLength": 3, "maxLength": 1}, "minLength 3 is above maxLength 1"),
    ({"type": "array", "items": {}, "minItems": 2, "maxItems": 0},
     "minItems 2 is above maxItems 0"),
    ({"type": "object", "minProperties": 5, "maxProperties": 4},
     "minProperties 5 is above maxProperties 4"),
])
def test_what_cannot_be_held_is_refused_with_its_keyword_and_path(schema: dict[str, Any],
                                                                  needle: str) -> None:
    """Items 3, 6, 7: the reason is the real one, fast, before anything is expanded."""
    t0 = time.perf_counter()
    with pytest.raises(InvalidRequestError) as info:
        grammar.for_request(schema, (), "auto")
    assert needle in f"{info.value.message} {info.value.hint}", info.value.message
    assert info.value.message.startswith("format: ") and info.value.hint
    assert time.perf_counter() - t0 < 30  # seconds and gigabytes before; a generous bound


def test_annotations_pass_and_unknown_formats_are_listed() -> None:
    schema = {"title": "T", "description": "d", "$schema": "x", "type": "object",
              "properties": {"e": {"type": "string", "format": "email", "default": "a@b",
                                   "examples": ["a@b"], "x-order": 1, "deprecated": False},
                             "p": {"type": "string", "format": "phone"}},
              "additionalProperties": False, "unevaluatedProperties": False}
    built = to_gbnf(schema, "format", 1 << 20)
    assert built.unchecked == ["format 'phone' at #/properties/p"]  # email: validated after
    assert set(keywords.ENFORCED).isdisjoint(keywords.ANNOTATIONS)
    assert set(keywords.VALIDATED).isdisjoint(keywords.ANNOTATIONS)


def test_a_large_enum_is_a_prefix_tree_under_the_cap() -> None:
    """Item 4: 50,000 words become a tree whose alternatives at any character are few."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = sorted({"".join(rng.choice(letters) for _ in range(rng.randint(3, 9)))
                    for _ in range(52_000)})[:50_000]
    gbnf = _gbnf({"enum": words})
    assert len(gbnf.encode()) < grammar.MAX_GRAMMAR_BYTES
    assert _widest_choice(gbnf) <= 27  # a flat alternation had 50,000 (a-z and the end)


def _widest_choice(gbnf: str) -> int:
    """The most alternatives of one rule or group (literals and classes skipped)."""
    widest = 0
    for line in gbnf.splitlines():
        counts, i = [1], line.index("::=") + 3
        while i < len(line):
            ch = line[i]
            if ch in '"[':
                close = '"' if ch == '"' else "]"
                i += 1
                while line[i] != close:
                    i += 2 if line[i] == "\\" else 1
            elif ch == "(":
                counts.append(1)
            elif ch == ")":
                widest = max(widest, counts.pop())
            elif ch == "|":
                counts[-1] += 1
            i += 1
        widest = max(widest, *counts)
    return widest


def test_the_docs_list_every_keyword() -> None:
    """docs/protocol.md's JSON Schemas list names every keyword modeld enforces, validates or
    accepts, and every format it holds or checks."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()
    section = doc[doc.index("**JSON Schemas**"):]
    missing = [k for k in (*keywords.ENFORCED, *keywords.VALIDATED, *keywords.ANNOTATIONS,
                           *keywords.FORMATS, *keywords.FORMATS_CHECKED)
               if f"`{k}`" not in section and f"`{k}`/" not in section and f"/`{k}`" not in section]
    assert not missing, missing

"""modeld.schema.validate, modeld.schema.formats and modeld.daemon.replycheck (issue 35, finding 6):
a complete reply checked against its whole schema. Cross-checked with the ``jsonschema``
package on random schemas and values of the keywords both know the same way; the formats and
the cost bounds on their own."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modeld.daemon.replycheck import ReplyCheck, for_request
from modeld.schema import validate as v
from modeld.schema.formats import CHECKS
from modeld.wire.messages import Tool

# ---------------------------------------------------------------------- against jsonschema

_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from([0.5, -1.5, 2.0, 1e3])
    | st.sampled_from(["", "a", "ab", "abc", "b"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["a", "b", "c", "dd"]), inner, max_size=3),
    max_leaves=12)


def _schemas() -> st.SearchStrategy[dict[str, Any]]:
    counts = st.integers(0, 3)
    numbers = st.sampled_from([-2, 0, 1, 2.5, 3])
    flat = st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["null", "boolean", "integer", "number", "string", "array",
                                 "object", ["integer", "string"], ["array", "null"]]),
        "enum": st.lists(_values, min_size=1, max_size=4),
        "const": _values,
        "minItems": counts, "maxItems": counts, "uniqueItems": st.booleans(),
        "minLength": counts, "maxLength": counts,
        "minProperties": counts, "maxProperties": counts,
        "minimum": numbers, "maximum": numbers, "exclusiveMinimum": numbers,
        "exclusiveMaximum": numbers, "multipleOf": st.sampled_from([1, 2, 3, 0.5]),
        "required": st.lists(st.sampled_from(["a", "b", "c"]), max_size=2, unique=True),
    })

    def nest(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
        return st.fixed_dictionaries({}, optional={
            "properties": st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=2),
            "additionalProperties": st.booleans() | inner,
            "propertyNames": st.fixed_dictionaries({}, optional={
                "maxLength": counts, "enum": st.lists(st.sampled_from(["a", "b", "dd"]),
                                                      min_size=1, max_size=3)}),
            "items": st.booleans() | inner,
            "prefixItems": st.lists(inner, min_size=1, max_size=2),
            "anyOf": st.lists(inner, min_size=1, max_size=3),
            "oneOf": st.lists(inner, min_size=1, max_size=3),
            "allOf": st.lists(inner, min_size=1, max_size=2),
            "not": inner,
        }).flatmap(lambda d: flat.map(lambda f: {**f, **d}))

    return st.recursive(flat, nest, max_leaves=6)  # type: ignore[arg-type]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_schemas(), value=_values)
def test_the_same_verdict_as_jsonschema(schema: dict[str, Any], value: Any) -> None:
    """Every keyword the check knows, with Draft 2020-12's meaning (formats and patterns
    aside: see below and the module's docstring)."""
    expected = jsonschema.Draft202012Validator(schema).is_valid(value)
    report = v.validate(value, schema)
    assert report.valid == expected, (schema, value, report.errors)


def test_references_recursive_and_shared() -> None:
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"]}}, "$ref": "#/$defs/node"}
    good = {"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3}]}
    bad = {"v": 1, "kids": [{"v": 2, "kids": [{"w": 1}]}]}
    assert v.validate(good, tree).valid
    report = v.validate(bad, tree)
    assert [(p.at, p.keyword) for p in report.errors] == [("/kids/0/kids/0", "required")]
    assert jsonschema.Draft202012Validator(tree).is_valid(good)
    assert not jsonschema.Draft202012Validator(tree).is_valid(bad)


def test_numbers_are_exact_and_json_equality_holds() -> None:
    """``0.3`` is a multiple of ``0.1`` (a float division says it is not); ``1`` equals
    ``1.0`` but not ``true``; a member written twice is not JSON modeld accepts."""
    assert v.validate(v.parse("0.3"), {"multipleOf": 0.1}).valid
    assert not v.validate(v.parse("0.35"), {"multipleOf": 0.1}).valid
    assert v.validate(v.parse("12345678901234567890"), {"multipleOf": 10}).valid
    assert isinstance(v.parse("0.1"), Decimal)
    assert not v.validate(v.parse("[1, 1.0]"), {"uniqueItems": True}).valid
    assert v.validate(v.parse("[1, true]"), {"uniqueItems": True}).valid
    assert v.validate(v.parse('{"a": [1.0]}'), {"const": {"a": [1]}}).valid
    assert not v.validate(v.parse("0.5"), {"exclusiveMinimum": 0.5}).valid
    assert not v.validate(v.parse("0.5"), {"minimum": 0.5, "exclusiveMinimum": True}).valid
    assert v.validate(v.parse("2.0"), {"type": "integer"}).valid
    with pytest.raises(ValueError, match="'a' is written twice"):
        v.parse('{"a": 1, "a": 2}')


def test_problems_say_where_and_which_keyword() -> None:
    schema = {"type": "object", "properties": {
        "tags": {"type": "array", "uniqueItems": True},
        "mail": {"type": "string", "format": "email"},
        "phone": {"type": "string", "format": "phone"},
        "n": {"type": "number", "exclusiveMaximum": 1.5}}}
    report = v.validate({"tags": ["x", "y", "x"], "mail": "nobody", "phone": "1", "n": 2},
                        schema)
    assert {(p.at, p.keyword) for p in report.errors} == {
        ("/tags", "uniqueItems"), ("/mail", "format"), ("/n", "exclusiveMaximum")}
    assert "elements 0 and 2 are equal" in report.errors[0].message
    assert report.unchecked == ["format 'phone' at /phone"]


# ---------------------------------------------------------------------- formats

FORMAT_CASES: dict[str, tuple[list[str], list[str]]] = {
    "date": (["2024-02-29", "0000-02-29", "1999-12-31"],
             ["2023-02-29", "1900-02-29", "2024-04-31", "2024-13-01", "2024-1-01", "24-01-01"]),
    "time": (["23:59:59Z", "00:00:00.123+05:30", "23:59:60z"],
             ["24:00:00Z", "12:60:00Z", "12:00:00", "12:00:00+24:00"]),
    "date-time": (["2024-01-01T12:00:00Z", "2024-01-01t12:00:00.5-01:00"],
                  ["2024-01-01 12:00:00Z", "2024-02-30T12:00:00Z", "2024-01-01T12:00Z"]),
    "uuid": (["123e4567-e89b-12d3-a456-426614174000"],
             ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"]),
    "duration": (["P1Y", "P1Y2M3DT4H5M6S", "PT0.5S", "P2W", "P1D"],
                 ["P", "PT", "1Y", "P1H", "P1.5Y", "PT1S1M"]),
    "email": (["a@b.co", "first.last+tag@example.org", '"a b"@x.io', "a@[127.0.0.1]"],
              ["nobody", "@x.io", "a@", "a..b@x.io", "a@-x.io", "a b@x.io"]),
    "hostname": (["example.com", "a", "xn--bcher-kva.example", "a-b.c."],
                 ["", "-a.com", "a_b.com", "a..b", "a" * 64 + ".com"]),
    "ipv4": (["0.0.0.0", "192.168.1.255"], ["256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4 "]),
    "ipv6": (["::1", "2001:db8::8a2e:370:7334", "::ffff:1.2.3.4"],
             ["1::2::3", "fe80::1%eth0", "12345::", "1.2.3.4"]),
    "uri": (["http://example.com/a?b=c#d", "urn:isbn:0451450523", "mailto:a@b.c"],
            ["/relative", "http://ex ample.com", "http://x/%zz", "1http://x"]),
    "uri-reference": (["/relative/path?q", "#frag", "", "http://x"], ["a b", "%g0", "#a#b"]),
    "json-pointer": (["", "/a", "/a~1b/~0c", "/"], ["a", "/a~2"]),
    "relative-json-pointer": (["0", "1/a", "2#"], ["-1", "01", "/a"]),
}


def test_every_checked_format_has_cases() -> None:
    assert set(FORMAT_CASES) == set(CHECKS)


@pytest.mark.parametrize("name", sorted(FORMAT_CASES))
def test_formats(name: str) -> None:
    good, bad = FORMAT_CASES[name]
    for text in good:
        assert CHECKS[name](text), (name, text)
    for text in bad:
        assert not CHECKS[name](text), (name, text)


# ---------------------------------------------------------------------- bounded cost

def test_a_hostile_schema_is_checked_once_per_place() -> None:
    """Two anyOf alternatives that both recurse: checked naively, 2^depth; each (subschema,
    place) pair is checked once, so a 60-deep reply costs a few hundred checks."""
    schema = {"$defs": {"t": {"anyOf": [
        {"type": "array", "items": {"$ref": "#/$defs/t"}, "maxItems": 1},
        {"type": "array", "items": {"$ref": "#/$defs/t"}, "minItems": 1}]}},
        "$ref": "#/$defs/t"}
    value: Any = []
    for _ in range(60):
        value = [value]
    report = v.validate(value, schema)
    assert report.valid, report.errors
    deep: Any = []
    for _ in range(100):
        deep = [deep]
    report = v.validate(deep, schema)
    assert not report.valid
    assert "not fully checked: the reply nests over 64 levels" in report.errors[0].message


def test_the_budget_stops_a_check_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(v, "BUDGET", 1000)
    report = v.validate(list(range(2000)), {"type": "array", "items": {"type": "integer"}})
    assert not report.valid and "not fully checked: over 1000 checks" in report.errors[0].message
    assert v.validate(list(range(500)), {"type": "array", "items": {"type": "integer"}}).valid


# ---------------------------------------------------------------------- a reply's check

def _check(schema: dict[str, Any], text: str, **done: Any) -> dict[str, Any]:
    check = for_request(schema, (), "auto")
    assert check is not None
    for part in (text[: len(text) // 2], text[len(text) // 2:]):
        check.add(part)
    return dict(check.result(done))


def test_a_reply_checked_whole() -> None:
    assert _check({"type": "array", "uniqueItems": True}, "[1, 2]") == {
        "valid": True, "errors": [], "unchecked": []}
    cut = _check({"type": "object"}, '{"a": [1, 2', finish_reason="length",
                 length_reason="max_tokens")
    assert not cut["valid"] and cut["errors"][0]["keyword"] == ""
    assert cut["errors"][0]["message"].startswith(
        "not complete JSON (cut at the max_tokens limit): ")
    twice = _check({"type": "object"}, '{"a": 1, "a": 2}')
    assert "'a' is written twice" in twice["errors"][0]["message"]
    json_format = for_request("json", (), "auto")
    assert json_format is not None and json_format.schema == {"type": "object"}


def test_a_forced_call_checks_its_arguments_against_its_tool() -> None:
    tags = Tool("tag", "", {"type": "object", "properties": {
        "tags": {"type": "array", "uniqueItems": True}}, "required": ["tags"]})
    other = Tool("other", "", None)
    check = for_request(None, (tags, other), "required")
    assert isinstance(check, ReplyCheck) and set(check.tools) == {"tag", "other"}
    done = {"tool_calls": [{"id": "1", "name": "tag", "arguments": '{"tags": ["a", "a"]}'},
                           {"id": "2", "name": "other", "arguments": '{"x": 1}'}]}
    result = check.result(done)
    assert [(e["at"], e["keyword"]) for e in result["errors"]] == [
        ("/tool_calls/0/arguments/tags", "uniqueItems")]
    none = check.result({"finish_reason": "length", "length_reason": "max_tokens"})
    assert none["errors"][0]["message"] == \
        "the reply made no tool call (cut at the max_tokens limit)"
    named = for_request(None, (tags, other), "function:other")
    assert named is not None and set(named.tools) == {"other"}
    assert for_request(None, (tags,), "auto") is None and for_request(None, (), "none") is None


def test_an_internal_error_is_reported_not_raised() -> None:
    class Broken(ReplyCheck):
        def _parts(self, done: Any, problems: Any) -> Any:
            raise RuntimeError("bug")

    result = Broken(schema={}).result({})
    assert not result["valid"] and "internal error" in result["errors"][0]["message"]
    assert json.dumps(result)  # plain data, for the wire

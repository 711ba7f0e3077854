"""A complete reply checked against its whole schema (issue 35): what the grammar cannot hold
(``uniqueItems``, ``multipleOf``, most ``format`` values, a fractional bound) is found here
and said in the reply, and what it does hold is checked again (a reply cut by ``max_tokens``
or a stop string is not complete JSON).

It knows exactly the keywords the converter accepts (:mod:`modeld.schema.keywords`), with
JSON Schema 2020-12's meaning, save what the grammar holds exactly and is not run again:
``pattern`` (a backtracking regular expression can take exponential time, and it would hold
the interpreter's lock all along: every stream of the daemon would wait), and
``unevaluatedProperties``/``unevaluatedItems`` (the grammar writes only declared members
and elements). Its cost is bounded: each (subschema, place in the reply) pair is checked once,
and at most :data:`BUDGET` of them, so a hostile schema cannot make it slow.

Pure: the standard library only. Numbers are compared exactly (the reply's are parsed as
:class:`~decimal.Decimal`: ``0.3`` is a multiple of ``0.1``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple
from urllib.parse import unquote

from modeld.schema.formats import CHECKS

#: (subschema, place) pairs checked at most, for one reply.
BUDGET = 1_000_000
#: Levels of the reply checked at most (deeper: not checked, and said so), as deep as a
#: request body may nest (:mod:`modeld.wire.textcheck`).
MAX_DEPTH = 64
#: Problems reported at most.
MAX_ERRORS = 10


@dataclass(frozen=True)
class Problem:
    """One way the reply fails its schema: where (a JSON pointer into the reply, ``""`` for
    the whole reply), which keyword ("" when the reply is not JSON at all), and why."""

    at: str
    keyword: str
    message: str


@dataclass
class Report:
    """What the check found: problems, and the formats it has no check for."""

    errors: list[Problem] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.errors


class _Stop(Exception):
    """The check went past its budget or depth: the reply is not known to be valid."""


def parse(text: str) -> Any:
    """The reply's JSON (numbers exact; raises ValueError naming a member written twice)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ValueError(f"the member {key[:100]!r} is written twice")
            out[key] = value
        return out

    from modeld.jsondepth import loads  # past the bound of every JSON: a ValueError

    return loads(text, parse_float=Decimal, object_pairs_hook=pairs)


def validate(value: Any, schema: Any, root: Any = None) -> Report:
    """Check ``value`` (JSON data, numbers as :func:`parse` makes them) against ``schema``
    (a part of ``root``, which its ``$ref`` values point into; None: ``schema`` itself)."""
    checker = _Checker(schema if root is None else root)
    report = Report()
    try:
        report.errors = checker.check(value, schema, "", 0)[:MAX_ERRORS]
    except _Stop as stop:
        report.errors = [Problem("", "", f"not fully checked: {stop}")]
    except RecursionError:
        report.errors = [Problem("", "", "not fully checked: the reply nests too deeply")]
    report.unchecked = [f"format {name!r} at {at or '/'}" + (f" and {n - 1} more" if n > 1 else "")
                        for name, (at, n) in checker.unchecked.items()]
    return report


def canonical(value: Any) -> str:
    """``value`` as text that equal JSON values share (``1`` and ``1.0``; keys in order)."""
    if value is True or value is False or value is None:
        return json.dumps(value)
    if isinstance(value, int | float | Decimal):
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        if number.is_finite() and number == number.to_integral_value():
            return str(int(number))
        return str(number.normalize())
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{canonical(v)}"
                              for k, v in sorted(value.items())) + "}"
    return repr(value)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float | Decimal):
        number = _number(value)
        return "integer" if number is not None and number.is_finite() and \
            number == number.to_integral_value() else "number"  # fmt: skip
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _number(value: Any) -> Decimal | None:
    """A bound or a reply number as a Decimal (None: not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        return None
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def _short(value: Any) -> str:
    text = canonical(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _child(at: str, key: str | int) -> str:
    return f"{at}/{str(key).replace('~', '~0').replace('/', '~1')}"


class _At(NamedTuple):
    """One keyword applied at one place of the reply."""

    word: str  # the keyword
    arg: Any  # its value in the schema
    schema: dict[str, Any]  # the schema it is in
    value: Any  # the part of the reply
    at: str  # where that part is (a JSON pointer)
    depth: int


class _Checker:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.memo: dict[tuple[int, str], list[Problem]] = {}
        self.steps = 0
        self.unchecked: dict[str, tuple[str, int]] = {}  # format -> (first place, count)
        self.consts: dict[int, set[str]] = {}
        self.plans: dict[int, list[tuple[str, Any, Callable[[_Checker, _At], list[Problem]]]]] = {}

    def check(self, value: Any, schema: Any, at: str, depth: int) -> list[Problem]:
        """The problems of ``value`` (at ``at`` in the reply) against ``schema``."""
        if schema is True or (isinstance(schema, dict) and not schema):
            return []
        if schema is False:
            return [Problem(at, "false", "no value is allowed here")]
        if not isinstance(schema, dict):
            return []
        key = (id(schema), at)
        if key in self.memo:  # checked already, or being checked (a $ref cycle adds nothing)
            return self.memo[key]
        self.steps += 1
        if self.steps > BUDGET:
            raise _Stop(f"over {BUDGET} checks")
        if depth > MAX_DEPTH:
            raise _Stop(f"the reply nests over {MAX_DEPTH} levels")
        self.memo[key] = []
        plan = self.plans.get(id(schema))
        if plan is None:  # the keywords that check something, once per subschema
            plan = self.plans[id(schema)] = [(w, arg, _KEYWORDS[w]) for w, arg in schema.items()
                                             if w in _KEYWORDS]
        out: list[Problem] = []
        for word, arg, fn in plan:
            out += fn(self, _At(word, arg, schema, value, at, depth))
            if len(out) >= MAX_ERRORS:
                break
        self.memo[key] = out
        return out

    def below(self, a: _At, value: Any, schema: Any, key: str | int) -> list[Problem]:
        """The problems of a member or element of ``a``'s value."""
        return self.check(value, schema, _child(a.at, key), a.depth + 1)

    # ------------------------------------------------------------------ keywords

    def _type(self, a: _At) -> list[Problem]:
        kinds = a.arg if isinstance(a.arg, list) else [a.arg]
        kind = _kind(a.value)
        if kind in kinds or (kind == "integer" and "number" in kinds):
            return []
        return [Problem(a.at, "type", f"{_short(a.value)} is not of type {' or '.join(kinds)}")]

    def _enum(self, a: _At) -> list[Problem]:
        if not isinstance(a.arg, list):
            return []
        allowed = self.consts.get(id(a.arg))
        if allowed is None:
            allowed = self.consts[id(a.arg)] = {canonical(v) for v in a.arg}
        if canonical(a.value) in allowed:
            return []
        return [Problem(a.at, "enum", f"{_short(a.value)} is not one of the enum values")]

    def _const(self, a: _At) -> list[Problem]:
        if canonical(a.value) == canonical(a.arg):
            return []
        return [Problem(a.at, "const", f"{_short(a.value)} is not {_short(a.arg)}")]

    def _properties(self, a: _At) -> list[Problem]:
        if not isinstance(a.value, dict) or not isinstance(a.arg, dict):
            return []
        out: list[Problem] = []
        for name, sub in a.arg.items():
            if name in a.value:
                out += self.below(a, a.value[name], sub, name)
        return out

    def _required(self, a: _At) -> list[Problem]:
        if not isinstance(a.value, dict) or not isinstance(a.arg, list):
            return []
        return [Problem(a.at, "required", f"the member {name!r} is missing")
                for name in a.arg if isinstance(name, str) and name not in a.value]

    def _additional(self, a: _At) -> list[Problem]:
        if not isinstance(a.value, dict):
            return []
        declared = a.schema.get("properties")
        declared = declared if isinstance(declared, dict) else {}
        out: list[Problem] = []
        for name, member in a.value.items():
            if name in declared:
                continue
            if a.arg is False:
                out.append(Problem(_child(a.at, name), "additionalProperties",
                                   f"the member {name!r} is not allowed"))
            else:
                out += self.below(a, member, a.arg, name)
        return out

    def _property_names(self, a: _At) -> list[Problem]:
        if not isinstance(a.value, dict):
            return []
        return [Problem(p.at, "propertyNames", f"the member name {name!r}: {p.message}")
                for name in a.value for p in self.below(a, name, a.arg, name)]

    def _items(self, a: _At) -> list[Problem]:
        if not isinstance(a.value, list):
            return []
        if isinstance(a.arg, list):  # draft 7 tuples: the elements past them are free
            return self._prefix_items(a)
        prefix = a.schema.get("prefixItems")
        start = len(prefix) if isinstance(prefix, list) else 0
        if a.arg is False:
            return [] if len(a.value) <= start else [Problem(
                _child(a.at, start), "items", f"{len(a.value)} elements, at most {start} "
                "are allowed")]
        out: list[Problem] = []
        for i in range(start, len(a.value)):
            out += self.below(a, a.value[i], a.arg, i)
            if len(out) >= MAX_ERRORS:
                break
        return out

    def _prefix_items(self, a: _At) -> list[Problem]:
        if not isinstance(a.value, list) or not isinstance(a.arg, list):
            return []
        out: list[Problem] = []
        for i, (item, sub) in enumerate(zip(a.value, a.arg, strict=False)):
            out += self.below(a, item, sub, i)
        return out

    def _count(self, a: _At) -> list[Problem]:
        """minItems/maxItems, minLength/maxLength, minProperties/maxProperties."""
        kind, noun = {"Items": (list, "elements"), "Length": (str, "characters"),
                      "Properties": (dict, "members")}[a.word[3:]]  # fmt: skip
        if not isinstance(a.value, kind) or not isinstance(a.arg, int | float):
            return []
        n = len(a.value)
        if a.word.startswith("min") and n < a.arg:
            return [Problem(a.at, a.word, f"{n} {noun}, fewer than {a.arg}")]
        if a.word.startswith("max") and n > a.arg:
            return [Problem(a.at, a.word, f"{n} {noun}, more than {a.arg}")]
        return []

    def _unique(self, a: _At) -> list[Problem]:
        if a.arg is not True or not isinstance(a.value, list):
            return []
        first: dict[str, int] = {}
        for i, item in enumerate(a.value):
            text = canonical(item)
            if text in first:
                return [Problem(a.at, "uniqueItems",
                                f"elements {first[text]} and {i} are equal ({_short(item)})")]
            first[text] = i
        return []

    def _format(self, a: _At) -> list[Problem]:
        if not isinstance(a.value, str) or not isinstance(a.arg, str):
            return []
        check = CHECKS.get(a.arg)
        if check is None:
            where, count = self.unchecked.get(a.arg, (a.at, 0))
            self.unchecked[a.arg] = (where, count + 1)
            return []
        if check(a.value):
            return []
        return [Problem(a.at, "format", f"{_short(a.value)} is not a valid {a.arg}")]

    def _bound(self, a: _At) -> list[Problem]:
        number, bound = _number(a.value), _number(a.arg)
        if number is None or bound is None:  # draft 4's boolean exclusives: see below
            return []
        low = a.word.endswith("inimum")
        # draft 4: a boolean exclusiveMinimum/Maximum makes minimum/maximum strict
        strict = a.word.startswith("exclusive") or \
            a.schema.get("exclusiveMinimum" if low else "exclusiveMaximum") is True  # fmt: skip
        fails = (number < bound or (strict and number == bound)) if low else \
            (number > bound or (strict and number == bound))  # fmt: skip
        if not fails:
            return []
        relation = ("greater than" if strict else "at least") if low else \
            ("less than" if strict else "at most")  # fmt: skip
        return [Problem(a.at, a.word, f"{_short(a.value)} is not {relation} {_short(a.arg)}")]

    def _multiple_of(self, a: _At) -> list[Problem]:
        number, step = _number(a.value), _number(a.arg)
        if number is None or step is None or step <= 0:
            return []
        try:
            fits = number % step == 0
        except InvalidOperation:  # the quotient has more digits than the context's precision
            fits = False
        return [] if fits else [Problem(a.at, "multipleOf",
                                        f"{_short(a.value)} is not a multiple of {_short(a.arg)}")]

    def _any_of(self, a: _At) -> list[Problem]:
        if not isinstance(a.arg, list):
            return []
        fits = sum(not self.check(a.value, sub, a.at, a.depth) for sub in a.arg)
        if fits == 1 or (fits and a.word == "anyOf"):
            return []
        if fits:
            return [Problem(a.at, a.word, f"it matches {fits} of the oneOf alternatives")]
        return [Problem(a.at, a.word, f"it matches none of the {a.word} alternatives")]

    def _all_of(self, a: _At) -> list[Problem]:
        if not isinstance(a.arg, list):
            return []
        return [p for sub in a.arg for p in self.check(a.value, sub, a.at, a.depth)]

    def _not(self, a: _At) -> list[Problem]:
        if self.check(a.value, a.arg, a.at, a.depth):
            return []
        return [Problem(a.at, "not", "it matches the schema under 'not'")]

    def _ref(self, a: _At) -> list[Problem]:
        target = resolve(self.root, a.arg)
        return [] if target is None else self.check(a.value, target, a.at, a.depth)


def resolve(root: Any, ref: Any) -> Any:
    """What the local reference ``ref`` (``#/$defs/x``) names in ``root`` (None: nothing)."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    target: Any = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return None
    return target


#: Keyword -> its check. Those left out constrain nothing here (annotations, $defs) or are
#: held by the grammar exactly (:data:`HELD_BY_GRAMMAR`).
_KEYWORDS: dict[str, Callable[[_Checker, _At], list[Problem]]] = {
    "type": _Checker._type,
    "enum": _Checker._enum,
    "const": _Checker._const,
    "properties": _Checker._properties,
    "required": _Checker._required,
    "additionalProperties": _Checker._additional,
    "propertyNames": _Checker._property_names,
    "minProperties": _Checker._count,
    "maxProperties": _Checker._count,
    "items": _Checker._items,
    "prefixItems": _Checker._prefix_items,
    "minItems": _Checker._count,
    "maxItems": _Checker._count,
    "uniqueItems": _Checker._unique,
    "minLength": _Checker._count,
    "maxLength": _Checker._count,
    "format": _Checker._format,
    "minimum": _Checker._bound,
    "maximum": _Checker._bound,
    "exclusiveMinimum": _Checker._bound,
    "exclusiveMaximum": _Checker._bound,
    "multipleOf": _Checker._multiple_of,
    "anyOf": _Checker._any_of,
    "oneOf": _Checker._any_of,
    "allOf": _Checker._all_of,
    "not": _Checker._not,
    "$ref": _Checker._ref,
}
#: What this check knows.
CHECKED = frozenset(_KEYWORDS)
#: The keywords the grammar holds exactly and this check does not run again.
HELD_BY_GRAMMAR = frozenset({"pattern", "unevaluatedProperties", "unevaluatedItems"})

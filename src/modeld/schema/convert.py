"""The schema walk: each (sub)schema becomes a rule, each keyword is enforced, annotated or
refused with its path (``#/properties/year``), and every count is bounded before it is used.

Each ``$ref`` target is one rule, named before its body is built, so recursive schemas
terminate; members follow the schema's order, required ones first, and each optional one may
be left out (a chain of one rule per optional member: linear, where llama.cpp's converter
recursed once per member and was quadratic).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from modeld.errors import InvalidRequestError
from modeld.schema import numbers, pattern
from modeld.schema.formats import CHECKS
from modeld.schema.gbnf import Rules, alternation, json_text, literal, other_key, repeat
from modeld.schema.keywords import (
    ANNOTATIONS,
    ENFORCED,
    FORMATS,
    MAX_ALTERNATIVES,
    MAX_OPTIONAL,
    MAX_REPEAT,
    VALIDATED,
    refused_hint,
)
from modeld.schema.validate import resolve, validate

_HINT = "see docs/protocol.md for the JSON Schema subset modeld enforces, or send " \
        "'format': 'json'"  # fmt: skip
#: Schemas visited inside one another (nesting and $refs together) before the schema counts as
#: too deep (the JSON itself nests at most 64 levels: modeld.wire.textcheck).
MAX_VISIT_DEPTH = 100
_KINDS = {  # the type a keyword implies when a schema names none
    "properties": "object", "additionalProperties": "object", "required": "object",
    "items": "array", "prefixItems": "array", "minItems": "array", "maxItems": "array",
    "minLength": "string", "maxLength": "string", "pattern": "string", "format": "string",
    "minimum": "number", "maximum": "number", "exclusiveMinimum": "number",
    "exclusiveMaximum": "number", "multipleOf": "number", "uniqueItems": "array",
    "propertyNames": "object", "minProperties": "object", "maxProperties": "object",
}  # fmt: skip
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_STRUCTURE = {"$defs", "definitions"}


@dataclass
class Built:
    """A schema's grammar, and the ``format`` values in it that modeld neither holds nor
    checks (annotations)."""

    gbnf: str
    unchecked: list[str] = field(default_factory=list)


def constant_limits(max_bytes: int) -> tuple[int, int]:
    """The most enum/const values, and bytes of their JSON text, one schema may list for a
    grammar of ``max_bytes``: each value is at least one literal of a prefix tree and its
    ``|`` (3 bytes or more); text over twice the grammar's size fits only when most of it is
    shared prefixes, and building its tree is the slow part (~2 us a character)."""
    return max_bytes // 3, 2 * max_bytes


def check_constants(schema: Any, what: str, max_bytes: int) -> None:
    """Refuse a schema whose enum/const lists, all together, pass :func:`constant_limits`,
    before anything else is done with it (a 700,000-word enum is refused here in ~0.1 s,
    where its trip to a builder process took 16 s on a busy machine). Every list counts,
    where :func:`to_gbnf` counts those it reaches: never less."""
    conv = _Converter({}, what, max_bytes)
    stack: list[tuple[Any, str]] = [(schema, "#")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                where = f"{path}/{_pointer(str(key))}"
                if key == "enum" and isinstance(value, list):
                    conv._count_constants(value, where)
                elif key == "const":
                    conv._count_constants([value], where)
                else:
                    stack.append((value, where))
        elif isinstance(item, list):
            stack.extend((sub, f"{path}/{i}") for i, sub in enumerate(item)
                         if isinstance(sub, dict | list))


def to_gbnf(schema: dict[str, Any], what: str, max_bytes: int) -> Built:
    """The grammar of the JSON texts ``schema`` allows (raises InvalidRequestError naming
    what it cannot hold, where)."""
    conv = _Converter(schema, what, max_bytes)
    root = conv.visit(schema, "#", "root")
    return Built(conv.rules.text(root), list(dict.fromkeys(conv.unchecked)))


class _Converter:
    def __init__(self, root: dict[str, Any], what: str, max_bytes: int) -> None:
        self.root, self.what = root, what
        self.rules = Rules(max_bytes, self._grammar_error)
        self.refs: dict[str, str] = {}
        self.unchecked: list[str] = []
        self.depth = 0
        # enum/const values and their JSON text, counted against the grammar's size before
        # any tree is built (a 700,000-word enum built ~1 GB of tree for 13 minutes first)
        self.constants = self.constant_bytes = 0

    def _count_constants(self, values: list[Any], path: str) -> None:
        """Count ``values`` against the grammar's bound before any of them is written or
        checked (the bound: :func:`constant_limits`)."""
        self.constants += len(values)
        max_values, max_text = constant_limits(self.rules.max_bytes)
        if self.constants > max_values:
            raise self._too_many(path, f"{self.constants} enum/const values", max_values)
        strings = [v for v in values if isinstance(v, str)]  # their text at least, in C
        if self.constant_bytes + sum(map(len, strings)) + 2 * len(strings) > max_text:
            raise self._too_many(path, f"over {max_text} bytes of enum/const text", max_text)

    def _texts(self, values: list[Any], path: str) -> Iterator[str]:
        """The JSON text of each of ``values`` (counted already), refused as soon as all
        enum/const text passes its bound."""
        max_text = constant_limits(self.rules.max_bytes)[1]
        for value in values:
            text = json_text(value)
            self.constant_bytes += len(text)
            if self.constant_bytes > max_text:
                raise self._too_many(path, f"over {max_text} bytes of enum/const text",
                                     max_text)
            yield text

    def _too_many(self, path: str, what: str, limit: int) -> InvalidRequestError:
        return InvalidRequestError(
            f"{self.what}: {what} (at {path[:200]}): more than a grammar of "
            f"{self.rules.max_bytes} bytes can hold",
            hint="list fewer or shorter values, or raise the max_grammar_bytes setting",
            details={"schema_path": path[:200], "limit": limit,
                     "max_grammar_bytes": self.rules.max_bytes})

    def _grammar_error(self, message: str, hint: str) -> InvalidRequestError:
        return InvalidRequestError(f"{self.what}: {message}", hint=hint)

    def fail(self, path: str, message: str, hint: str = _HINT) -> InvalidRequestError:
        return InvalidRequestError(f"{self.what}: {message} (at {path[:200]})", hint=hint,
                                   details={"schema_path": path[:200]})

    # ------------------------------------------------------------------ dispatch

    def visit(self, schema: Any, path: str, hint: str) -> str:
        """A rule name matching the JSON of ``schema``."""
        if schema is True or schema == {}:
            return self.rules.primitive("value")
        if not isinstance(schema, dict):
            raise self.fail(path, "a schema must be an object or true")
        self.depth += 1
        try:
            if self.depth > MAX_VISIT_DEPTH:
                raise self.fail(path, f"the schema nests over {MAX_VISIT_DEPTH} schemas deep "
                                "(its $refs included)", "flatten it")
            return self._visit(schema, path, hint)
        finally:
            self.depth -= 1

    def _visit(self, schema: dict[str, Any], path: str, hint: str) -> str:
        keys = self._constraints(schema, path)
        if "$ref" in keys:
            if keys - {"$ref"}:
                raise self.fail(path, f"'{sorted(keys - {'$ref'})[0]}' beside '$ref' is not "
                                "supported", "move it into the schema the $ref names")
            return self._ref(schema["$ref"], path)
        if "allOf" in keys:
            return self.visit(self._all_of(schema, path), path, hint)
        if "anyOf" in keys or "oneOf" in keys:
            word = "anyOf" if "anyOf" in keys else "oneOf"
            alts = self._distribute(schema, word, path) if keys - {word} else schema[word]
            return self._union(alts, f"{path}/{word}", hint)
        if "const" in keys or "enum" in keys:
            return self._constants(schema, keys, path, hint)
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind or not all(k in _TYPES for k in kind):
                raise self.fail(path, "'type' must name JSON types")
            alts = [self.visit({**schema, "type": k}, path, f"{hint}-{k}") for k in kind]
            return self.rules.define(hint, " | ".join(alts))
        if kind is None:
            implied = {_KINDS[k] for k in keys if k in _KINDS}
            if len(implied) > 1:
                raise self.fail(path, f"keywords of several types ({', '.join(sorted(implied))})"
                                " without a 'type'", "give the schema a 'type'")
            kind = implied.pop() if implied else None
        elif kind not in _TYPES:
            raise self.fail(path, f"'type' {kind!r} is not a JSON type")
        if kind is None:
            return self.rules.primitive("value")
        return getattr(self, f"_{kind}")(schema, keys, path, hint)  # type: ignore[no-any-return]

    def _constraints(self, schema: dict[str, Any], path: str) -> set[str]:
        """The keywords of ``schema`` that constrain (annotations left out); refuses those
        modeld cannot enforce."""
        keys = set()
        for key, value in schema.items():
            if key in ANNOTATIONS or key.startswith("x-") or key in _STRUCTURE:
                continue
            where = f"{path}/{key}"
            if key not in ENFORCED and key not in VALIDATED:
                raise self.fail(where, f"the keyword '{key}' is not supported",
                                refused_hint(key))
            if key == "uniqueItems":
                if not isinstance(value, bool):
                    raise self.fail(where, "must be true or false")
                continue  # no grammar: the complete reply is validated
            if key == "multipleOf" and (isinstance(value, bool) or not isinstance(
                    value, int | float) or not math.isfinite(value) or value <= 0):
                raise self.fail(where, "must be a number above 0")
            if key in ("unevaluatedProperties", "unevaluatedItems"):
                continue  # the grammar writes only what the schema declares: always met
            if key == "format" and value not in FORMATS:
                if value not in CHECKS:
                    self.unchecked.append(f"format {value!r} at {path}")
                continue  # validated after (or an annotation)
            keys.add(key)
        return keys

    # ------------------------------------------------------------------ references, unions

    def _ref(self, ref: Any, path: str) -> str:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise self.fail(path, f"the $ref {str(ref)[:100]!r} is not local",
                            "only references into the schema itself (#/$defs/…) are followed")
        if ref in self.refs:
            return self.refs[ref]
        target = self._target(ref, path)
        name = self.rules.name(ref.rsplit("/", 1)[-1] or "self")
        self.refs[ref] = name  # before its body: a recursive reference ends here
        self.rules.add(name, self.visit(target, ref, name))
        return name

    def _target(self, ref: str, path: str) -> Any:
        """What the local JSON pointer ``ref`` names in the schema."""
        target = resolve(self.root, ref)
        if target is None:
            raise self.fail(path, f"the $ref {ref[:100]!r} names nothing in the schema")
        return target

    def _union(self, alts: Any, path: str, hint: str) -> str:
        if not isinstance(alts, list) or not alts:
            raise self.fail(path, "must be a non-empty list of schemas")
        constants = [a for a in alts if isinstance(a, dict) and set(a) - ANNOTATIONS == {"const"}]
        others = [a for a in alts if not any(a is c for c in constants)]
        if len(others) > MAX_ALTERNATIVES:
            raise self.fail(path, f"{len(others)} alternatives (at most {MAX_ALTERNATIVES} that "
                            "are not constants: each one costs every token of the reply)",
                            "use fewer alternatives, or enum/const values (those have no limit)")
        rules = [self.visit(a, f"{path}/{i}", f"{hint}-{i}") for i, a in enumerate(others)]
        if constants:
            self._count_constants(constants, path)
            tree = alternation(self.rules, f"{hint}-const",
                               self._texts([c["const"] for c in constants], path))
            rules.append(self.rules.define(hint, f"{tree} space"))
        return self.rules.define(hint, " | ".join(rules))

    def _distribute(self, schema: dict[str, Any], word: str, path: str) -> list[Any]:
        """The alternatives of ``word`` with the keywords beside it moved into each (zod's
        ``{"type": "string", "anyOf": [{"format": "ipv4"}, {"format": "ipv6"}]}``); a constant
        alternative stays a constant when it satisfies them, and is left out when not."""
        beside = {k: v for k, v in schema.items() if k != word and k not in ANNOTATIONS}
        if "anyOf" in beside or "oneOf" in beside or "$ref" in beside:
            other = sorted(set(beside) & {"anyOf", "oneOf", "$ref"})[0]
            raise self.fail(path, f"'{other}' beside '{word}' is not supported",
                            f"move it into each of the {word} alternatives")
        alts = schema[word]
        if not isinstance(alts, list):
            return alts  # type: ignore[no-any-return]  # _union says what is wrong
        out: list[Any] = []
        for i, alt in enumerate(alts):
            if not isinstance(alt, dict) or "$ref" in alt:
                raise self.fail(f"{path}/{word}/{i}", f"keywords beside '{word}' with an "
                                "alternative that is a $ref are not supported",
                                f"move them into each of the {word} alternatives")
            if set(alt) - ANNOTATIONS == {"const"} and "pattern" not in beside:
                if validate(alt["const"], beside, self.root).valid:
                    out.append(alt)
                continue
            clash = [k for k in beside if k in alt and alt[k] != beside[k]]
            if clash:
                raise self.fail(f"{path}/{word}/{i}/{clash[0]}", f"'{clash[0]}' both beside "
                                f"'{word}' and in an alternative is not supported",
                                "give it in one place")
            out.append({**beside, **alt})
        if not out:
            raise self.fail(path, f"no {word} alternative satisfies the keywords beside it")
        return out

    def _all_of(self, schema: dict[str, Any], path: str) -> dict[str, Any]:
        """``allOf`` as one schema: its only member, or object schemas merged."""
        parts = schema["allOf"]
        if not isinstance(parts, list) or not parts:
            raise self.fail(f"{path}/allOf", "must be a non-empty list of schemas")
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        if len(parts) == 1 and not self._constraints(rest, path):
            return parts[0] if isinstance(parts[0], dict) else {}
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for i, part in enumerate([rest, *parts]):
            where = f"{path}/allOf/{i - 1}" if i else path
            while isinstance(part, dict) and set(part) - ANNOTATIONS == {"$ref"}:
                if not isinstance(part["$ref"], str) or not part["$ref"].startswith("#"):
                    raise self.fail(where, "allOf with a $ref that is not local")
                part = self._target(part["$ref"], where)
            extra = self._constraints(part, where) - {"type", "properties", "required"} \
                if isinstance(part, dict) else {"?"}  # fmt: skip
            if extra or part.get("type", "object") != "object":
                raise self.fail(where, "allOf of schemas that are not plain objects is not "
                                "supported", "merge them into one schema")
            merged["properties"].update(part.get("properties", {}))
            merged["required"] += list(part.get("required", []))
        return merged

    def _constants(self, schema: dict[str, Any], keys: set[str], path: str, hint: str) -> str:
        """The values of ``enum``/``const`` that also satisfy the schema's other keywords
        (checked here, once: the grammar then holds exactly those)."""
        values = [schema["const"]] if "const" in keys else schema["enum"]
        if not isinstance(values, list) or not values:
            raise self.fail(f"{path}/enum", "must be a non-empty list")
        where = f"{path}/const" if "const" in keys else f"{path}/enum"
        self._count_constants(values, where)  # before any value is checked against the rest
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const")}
        if keys - {"const", "enum", "type"} or "format" in rest or "uniqueItems" in rest:
            if "pattern" in keys:
                raise self.fail(path, "'pattern' beside enum/const is not supported",
                                "list only the values you want")
            for sub in ("items", "prefixItems", "properties", "additionalProperties",
                        "propertyNames"):
                if sub in rest:
                    raise self.fail(path, f"'{sub}' beside enum/const is not supported",
                                    "list only the values you want")
        if rest:  # only other keywords can rule a listed value out (a 50,000-value enum: 0.1 s)
            values = [v for v in values if validate(v, rest, self.root).valid]
        if not values:
            raise self.fail(path, "no enum/const value satisfies the schema's other keywords")
        tree = alternation(self.rules, f"{hint}-value", self._texts(values, where))
        return self.rules.define(hint, f"{tree} space")

    # ------------------------------------------------------------------ types

    def _object(self, schema: dict[str, Any], keys: set[str], path: str, hint: str) -> str:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        extra = False if schema.get("propertyNames") is False else \
            schema.get("additionalProperties")  # fmt: skip
        if not isinstance(props, dict) or not isinstance(required, list) or \
                not all(isinstance(r, str) for r in required):  # fmt: skip
            raise self.fail(path, "'properties' must be an object and 'required' a list of names")
        if not props and not required:  # a map: its members' count and keys can be held
            return self._map(schema, path, hint)
        members = dict(props)
        for name in required:  # required but not declared: its schema is additionalProperties'
            if name not in members:
                if extra is False:
                    raise self.fail(path, f"'{name[:100]}' is required but not allowed")
                members[name] = {} if extra in (None, True) else extra
        kv = {}
        for name, sub in members.items():
            value = self.visit(sub, f"{path}/properties/{_pointer(name)}", name)
            kv[name] = self.rules.define(f"{name}-kv", f'{_key(name)} space ":" space {value}')
        needed = [kv[n] for n in members if n in required]
        optional = [kv[n] for n in members if n not in required]
        if extra is not None and extra is not False:
            # keys from propertyNames may spell a declared name: the validation after says so
            key = self._key_rule(schema, path, hint) or other_key(self.rules, f"{hint}-key",
                                                                  members)
            pair = self._pair(key, extra, f"{path}/additionalProperties", hint)
            optional.append(self.rules.define(f"{hint}-extras", f'{pair} ("," space {pair})*'))
        if len(optional) > MAX_OPTIONAL:
            raise self.fail(path, f"{len(optional)} optional members (at most {MAX_OPTIONAL}: "
                            "each one costs every token of the reply)",
                            "make members required, or split the object")
        body = ' "," space '.join(needed)
        if optional:
            chain = self._optional_chain(optional, hint)
            if needed:
                body += f" {chain[0]}"
            else:  # the first member present may be any optional one
                firsts = [f"{o} {c}" if c else o
                          for o, c in zip(optional, [*chain[1:], ""], strict=True)]
                body = "(" + " | ".join(firsts) + ")?"
        return self.rules.define(hint, f'"{{" space {body} "}}" space')

    def _map(self, schema: dict[str, Any], path: str, hint: str) -> str:
        """An object that declares no members: any number of them (minProperties to
        maxProperties), keys from propertyNames, values from additionalProperties."""
        extra = schema.get("additionalProperties")
        low = self._count(schema, "minProperties", path)
        high = self._count(schema, "maxProperties", path)
        if extra is False or schema.get("propertyNames") is False:
            high = 0
        if low == 0 and high is None and extra in (None, True) and \
                "propertyNames" not in schema:  # fmt: skip
            return self.rules.primitive("object")
        key = self._key_rule(schema, path, hint) or self.rules.primitive("string")
        value, where = True if extra is None else extra, f"{path}/additionalProperties"
        body = repeat(self._pair(key, value, where, hint), low, high, sep='"," space')
        return self.rules.define(hint, f'"{{" space {body} "}}" space')

    def _pair(self, key: str, value: Any, where: str, hint: str) -> str:
        rule = self.visit(value, where, f"{hint}-extra")
        return self.rules.define(f"{hint}-extra-kv", f'{key} ":" space {rule}')

    def _key_rule(self, schema: dict[str, Any], path: str, hint: str) -> str | None:
        """The rule of a member's key from ``propertyNames`` (None: it has none)."""
        names = schema.get("propertyNames")
        if names is None or names is True or names is False:  # false: no member (the callers)
            return None
        where = f"{path}/propertyNames"
        if not isinstance(names, dict) or names.get("type", "string") != "string" or \
                set(names) & {"$ref", "anyOf", "oneOf", "allOf"}:  # fmt: skip
            raise self.fail(where, "propertyNames must be a string schema without $ref, "
                            "anyOf, oneOf or allOf", "give the keys' enum, pattern or lengths")
        return self.visit({**names, "type": "string"}, where, f"{hint}-key")

    def _optional_chain(self, optional: list[str], hint: str) -> list[str]:
        """Rules ``rest[i]``: optional members i.. in order, each after a comma or left out."""
        names: list[str] = [""] * len(optional)
        after = ""
        for i in range(len(optional) - 1, -1, -1):
            body = f'("," space {optional[i]})? {after}'.strip()
            names[i] = after = self.rules.define(f"{hint}-rest", body)
        return names

    def _array(self, schema: dict[str, Any], keys: set[str], path: str, hint: str) -> str:
        low, high = self._count(schema, "minItems", path), self._count(schema, "maxItems", path)
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        if isinstance(items, list):  # draft 7 tuples
            prefix, items = items, False
        if not isinstance(prefix, list):
            raise self.fail(f"{path}/prefixItems", "must be a list of schemas")
        if len(prefix) > MAX_REPEAT:
            raise self.fail(f"{path}/prefixItems", f"over {MAX_REPEAT} elements")
        parts = [self.visit(s, f"{path}/prefixItems/{i}", f"{hint}-{i}")
                 for i, s in enumerate(prefix)]
        if high is not None and high < len(parts):
            raise self.fail(path, "maxItems is below the number of prefixItems")
        body = ' "," space '.join(parts)
        if items is not False:
            item = self.visit(items, f"{path}/items", f"{hint}-item")
            more_low = max(low - len(parts), 0)
            more_high = None if high is None else high - len(parts)
            if parts:
                more = repeat(f'("," space {item})', more_low, more_high)
                body = f"{body} {more}".strip()
            else:
                body = repeat(item, more_low, more_high, sep='"," space')
        elif low > len(parts):
            raise self.fail(path, "minItems is above the number of elements allowed")
        return self.rules.define(hint, f'"[" space {body} "]" space')

    def _string(self, schema: dict[str, Any], keys: set[str], path: str, hint: str) -> str:
        fmt = schema.get("format")
        # beside a pattern or a format with a grammar, the lengths (and the format) are only
        # validated after: the grammar holds the pattern, else the format
        if "pattern" in keys:
            text = schema["pattern"]
            if not isinstance(text, str):
                raise self.fail(f"{path}/pattern", "must be a string")
            return self.rules.define(hint, pattern.to_gbnf(
                text, lambda why: self.fail(f"{path}/pattern", f"the pattern {why}")))
        if "format" in keys:
            return self.rules.primitive("uuid" if fmt == "uuid" else f"{fmt}-string")
        low, high = self._count(schema, "minLength", path), self._count(schema, "maxLength", path)
        if low == 0 and high is None:
            return self.rules.primitive("string")
        char = self.rules.primitive("char")
        return self.rules.define(hint, f'"\\"" {repeat(char, low, high)} "\\"" space')

    def _integer(self, schema: dict[str, Any], keys: set[str], path: str, hint: str) -> str:
        bounds = self._bounds(schema, path)
        if not bounds:
            return self.rules.primitive("integer")
        lo, hi = numbers.integer_bounds(bounds)
        if lo > hi:
            raise self.fail(path, "no integer is within its bounds")
        return self.rules.define(hint, f"({numbers.integer_range(lo, hi)}) space")

    def _number(self, schema: dict[str, Any], keys: set[str], path: str, hint: str) -> str:
        step = schema.get("multipleOf")
        if step is not None and float(step).is_integer():  # its multiples are integers
            return self._integer(schema, keys, path, hint)
        bounds = self._bounds(schema, path)
        if not bounds:
            return self.rules.primitive("number")
        found = numbers.number_bounds(bounds)
        if found is None:
            raise self.fail(path, "no number the grammar writes (16 digits at most) is "
                            "within its bounds")
        lo, lo_open, hi, hi_open = found
        body = numbers.number_range(lo, lo_open, hi, hi_open) if lo <= hi else ""
        if not body:
            raise self.fail(path, "no number is within its bounds")
        return self.rules.define(hint, f"({body}) space")

    def _boolean(self, schema: dict[str, Any], keys: set[str], path: str, hint: str) -> str:
        return self.rules.primitive("boolean")

    def _null(self, schema: dict[str, Any], keys: set[str], path: str, hint: str) -> str:
        return self.rules.primitive("null")

    # ------------------------------------------------------------------ checks

    def _count(self, schema: dict[str, Any], key: str, path: str) -> Any:
        """A count keyword's value for the grammar: 0 or None (no bound) when absent. A
        maximum past :data:`MAX_REPEAT` (pydantic's URLs have maxLength 2083) is left to the
        validation after: the grammar's repetition is then unbounded above."""
        value = schema.get(key)
        if value is None:
            return 0 if key.startswith("min") else None
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or \
                not float(value).is_integer():  # fmt: skip
            raise self.fail(f"{path}/{key}", "must be a non-negative integer")
        low_key = "min" + key[3:]
        low = schema.get(low_key) if key.startswith("max") else None
        if isinstance(low, int | float) and not isinstance(low, bool) and low > value:
            # nothing satisfies it: a grammar like char{3,1} would hold the sampler forever
            raise self.fail(path, f"{low_key} {low} is above {key} {value}: nothing fits")
        if value > MAX_REPEAT and key.startswith("max"):
            return None
        if value > MAX_REPEAT:
            raise self.fail(f"{path}/{key}", f"{key} {int(value)} is over {MAX_REPEAT}, the "
                            "most a grammar repeats", f"use {key} of at most {MAX_REPEAT}")
        return int(value)

    def _bounds(self, schema: dict[str, Any], path: str) -> dict[str, float]:
        """The numeric bounds (:func:`numbers.read_bounds`), a bad one refused with its path."""
        return numbers.read_bounds(schema, lambda key: self.fail(f"{path}/{key}",
                                                                 "must be a number"))


def _key(name: str) -> str:
    return literal(json_text(name))


def _pointer(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")[:100]

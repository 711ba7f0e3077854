"""What modeld does with each JSON Schema keyword, and the limits of a schema it turns into a
grammar: declared once here; the converter, its errors and docs/protocol.md's list use it.

Three kinds. *Enforced*: the grammar only lets the model write replies that satisfy it.
*Annotation*: it says nothing about which replies are valid (JSON Schema's annotations, and
``format`` values modeld has no grammar for, which JSON Schema 2020-12 also treats as
annotations by default); the daemon's log names each such ``format`` of a request.
Anything else is *refused*: a 400 naming the keyword and where it is.
"""

from __future__ import annotations

#: Keywords the grammar enforces (what for, in the docs' words).
ENFORCED: dict[str, str] = {
    "type": "one type or a list of them",
    "enum": "any JSON values",
    "const": "any JSON value",
    "properties": "object members, in the schema's order",
    "required": "members that must be present (the others are optional)",
    "additionalProperties": "false (the default here: only declared members), true or a schema",
    "items": "one schema for every element",
    "prefixItems": "a tuple: exactly these elements",
    "minItems": "",
    "maxItems": "",
    "minLength": "",
    "maxLength": "",
    "pattern": "a regular expression anchored with ^…$",
    "minimum": "integers; numbers when the bound is a whole number",
    "maximum": "integers; numbers when the bound is a whole number",
    "exclusiveMinimum": "as minimum",
    "exclusiveMaximum": "as maximum",
    "anyOf": "",
    "oneOf": "as anyOf: the alternatives should not overlap (pydantic's unions do not)",
    "allOf": "one schema, or object schemas merged",
    "$ref": "local references (#/…), recursive ones too",
    "$defs": "",
    "definitions": "",
    "format": "date, time, date-time, uuid (others are annotations)",
    "uniqueItems": "false only (true cannot be held by a grammar: refused)",
    "unevaluatedProperties": "always met: the grammar writes declared members only",
    "unevaluatedItems": "always met: the grammar writes the declared elements only",
}

#: Keywords that constrain nothing (JSON Schema's annotations and OpenAPI's ``discriminator``,
#: which only names the member the ``oneOf`` alternatives already tell apart).
ANNOTATIONS: frozenset[str] = frozenset({
    "title", "description", "default", "examples", "$comment", "$schema", "$id", "$anchor",
    "deprecated", "readOnly", "writeOnly", "contentEncoding", "contentMediaType",
    "discriminator",
})  # fmt: skip

#: Refused keywords whose 400 can say what to send instead.
HINTS: dict[str, str] = {
    "nullable": "an OpenAPI keyword: write \"type\": [\"…\", \"null\"] or anyOf with "
                "{\"type\": \"null\"}",
    "uniqueItems": "a grammar cannot keep elements distinct: leave uniqueItems out and check "
                   "the reply",
    "multipleOf": "leave it out, or list the allowed values with enum",
    "not": "describe what is allowed instead (enum, anyOf)",
    "patternProperties": "list the members in properties, or use additionalProperties",
    "propertyNames": "list the members in properties",
}

#: String formats with a grammar (each a rule of :mod:`modeld.schema.gbnf`).
FORMATS = ("date", "time", "date-time", "uuid")

#: The largest count a repetition bound may name: minItems, maxItems, minLength, maxLength
#: and a pattern's {m,n}. llama.cpp's grammar parser refuses a larger minimum
#: (MAX_REPETITION_THRESHOLD) and would build one rule per repetition of a maximum.
MAX_REPEAT = 2000
#: Alternatives of one anyOf/oneOf/type list whose members are not constants: llama.cpp's
#: sampler keeps a stack per alternative at each step and compares them pairwise, so the cost of
#: every token of the reply grows with the square of this. Constants (enum, const) have no such
#: limit: they become a prefix tree, which branches at most once per distinct character.
MAX_ALTERNATIVES = 64
#: Optional members of one object: after each member, each later optional one may come next
#: (a stack apiece in the sampler, as for alternatives).
MAX_OPTIONAL = 64
#: Rules in one grammar (each $ref, member and alternative makes some).
MAX_RULES = 20_000


def refused_hint(keyword: str) -> str:
    """What to do about a refused ``keyword``."""
    return HINTS.get(keyword, "leave it out: modeld's grammar cannot hold a reply to it "
                              "(docs/protocol.md lists what it can)")

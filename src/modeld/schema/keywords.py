"""What modeld does with each JSON Schema keyword, and the limits of a schema it turns into a
grammar: declared once here; the converter, its errors and docs/protocol.md's list use it.

Four kinds. *Enforced*: the grammar only lets the model write replies that satisfy it (the
exceptions each description names are validated after). *Validated*: no grammar holds it; the
complete reply is checked against it (:mod:`modeld.schema.validate`) and the reply says whether
it passed. Every reply to a schema is validated against the whole schema, enforced keywords
too. *Annotation*: it says nothing about which replies are valid (and a ``format`` modeld
has no check for, which the reply lists as not checked). Anything else is *refused*: a 400
naming the keyword and where it is: keywords that change what must be written (``contains``,
``if``, ``patternProperties``, ...), where a grammar that ignored them would lead the model to
replies that fail.
"""

from __future__ import annotations

from modeld.schema.formats import CHECKS

#: String formats with a grammar (each a rule of :mod:`modeld.schema.gbnf`).
FORMATS = ("date", "time", "date-time", "uuid")
#: String formats with no grammar that the complete reply is checked for (the four above are
#: checked too: the grammar lets February 30th through).
FORMATS_CHECKED = tuple(f for f in CHECKS if f not in FORMATS)

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
    "maxItems": "over 2000: validated after",
    "minLength": "validated after beside a pattern or a format with a grammar",
    "maxLength": "as minLength; over 2000: validated after",
    "pattern": "a regular expression, found anywhere unless anchored with ^ or $",
    "propertyNames": "the keys of members beside the declared ones (a string schema)",
    "minProperties": "objects that declare no members (validated after for the others)",
    "maxProperties": "as minProperties",
    "minimum": "integers; numbers: the whole numbers around a fractional bound (validated "
               "after)",
    "maximum": "as minimum",
    "exclusiveMinimum": "as minimum",
    "exclusiveMaximum": "as maximum",
    "anyOf": "keywords beside it go into each alternative",
    "oneOf": "as anyOf: the alternatives should not overlap (pydantic's unions do not)",
    "allOf": "one schema, or object schemas merged",
    "$ref": "local references (#/…), recursive ones too",
    "$defs": "",
    "definitions": "",
    "format": "date, time, date-time, uuid (the others modeld knows are validated after)",
    "unevaluatedProperties": "always met: the grammar writes declared members only",
    "unevaluatedItems": "always met: the grammar writes the declared elements only",
}

#: Keywords no grammar holds: the complete reply is validated against them.
VALIDATED: dict[str, str] = {
    "uniqueItems": "a grammar cannot keep elements distinct",
    "multipleOf": "a whole-number multipleOf keeps a number's grammar to integers",
    "format": ", ".join(FORMATS_CHECKED),
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
    "not": "describe what is allowed instead (enum, anyOf)",
    "patternProperties": "a grammar cannot keep a map's keys distinct, and models repeat keys "
                         "held to a pattern (2 replies of 4 wrote one twice): list the keys "
                         "in properties, or send a map with propertyNames (a repeated key is "
                         "reported by the reply's validation)",
}


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

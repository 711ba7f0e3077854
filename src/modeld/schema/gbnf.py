"""A GBNF grammar as it is built: named rules, literals, bounded repetitions, and literal
alternations as prefix trees.

Every rule is added through :meth:`Rules.add`, which counts the grammar's bytes and rules and
stops the build as soon as a limit is passed: nothing the schema asks for is built first and
measured after. Repetitions use GBNF's ``x{m,n}``, which llama.cpp expands itself (their
counts are bounded by the converter before they get here).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from modeld.errors import InvalidRequestError
from modeld.schema.keywords import MAX_RULES

SPACE = '" "?'  # at most one space between tokens: a greedy model cannot run away in blanks

#: The JSON building blocks: name -> (body, rules it uses).
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "boolean": ('("true" | "false") space', ()),
    "null": ('"null" space', ()),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "number": ('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space',
               ("integral-part", "decimal-part")),
    "integer": ('("-"? integral-part) space', ("integral-part",)),
    "char": (r'[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": (r'"\"" char* "\"" space', ("char",)),
    "value": ("object | array | string | number | boolean | null",
              ("object", "array", "string", "number", "boolean", "null")),
    "object": ('"{" space ( string ":" space value ("," space string ":" space value)* )? '
               '"}" space', ("string", "value")),
    "array": ('"[" space ( value ("," space value)* )? "]" space', ("value",)),
    "uuid": (r'"\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             r'[0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"" space', ()),
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )',
             ()),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
             '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', ()),
    "date-time": ('date "T" time', ("date", "time")),
    "date-string": (r'"\"" date "\"" space', ("date",)),
    "time-string": (r'"\"" time "\"" space', ("time",)),
    "date-time-string": (r'"\"" date-time "\"" space', ("date-time",)),
}
RESERVED = frozenset({"root", "space", "dot", *PRIMITIVES})
_NAME_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
_NAME = re.compile(r"[a-zA-Z0-9-]+")
#: Inline groups nest at most this deep in a prefix tree before a node becomes a rule of its own
#: (llama.cpp's parser recurses per group).
_TREE_NESTING = 16


def literal(text: str) -> str:
    """``text`` as a GBNF literal: every character that is not printable ASCII is escaped, so
    a quote, a backslash or a newline in a constant can never end or break the literal."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def json_text(value: Any) -> str:
    """The JSON a constant is written as (UTF-8 kept, as llama.cpp writes it)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def repeat(item: str, low: int, high: int | None, sep: str = "") -> str:
    """``item`` ``low`` to ``high`` (None: any) times, ``sep`` between; ``item`` must be one
    symbol (a rule name, a literal or a class)."""
    if high == 0:
        return ""
    if not sep:
        if (low, high) == (0, 1):
            return f"{item}?"
        if high is None:
            return f"{item}*" if low == 0 else (f"{item}+" if low == 1 else f"{item}{{{low},}}")
        return f"{item}{{{low}}}" if low == high else f"{item}{{{low},{high}}}"
    rest = repeat(f"({sep} {item})", max(low - 1, 0), None if high is None else high - 1)
    both = f"{item} {rest}".strip()
    return both if low > 0 else f"({both})?"


@dataclass
class Rules:
    """The rules so far, with the byte and rule limits checked on every addition."""

    max_bytes: int
    fail: Callable[[str, str], InvalidRequestError]
    rules: dict[str, str] = field(default_factory=lambda: {"space": SPACE})
    size: int = 0
    _counts: dict[str, int] = field(default_factory=dict)

    def name(self, hint: str) -> str:
        """A fresh rule name from ``hint`` (a member name, a $defs key: sanitized, short)."""
        base = _NAME_CHARS.sub("-", hint)[:24].strip("-").lower() or "r"
        if base in RESERVED or base[0].isdigit():
            base = f"r-{base}"
        n = self._counts.get(base, 0)
        self._counts[base] = n + 1
        name = base if n == 0 else f"{base}-{n}"
        while name in self.rules:
            n += 1
            self._counts[base] = n + 1
            name = f"{base}-{n}"
        return name

    def add(self, name: str, body: str) -> str:
        """Define ``name`` (a fresh one from :meth:`name`, or a reserved one)."""
        self.size += len(name) + len(body.encode()) + 5
        if self.size > self.max_bytes:
            raise self.fail(f"the grammar built from it is over {self.max_bytes} bytes",
                            "use fewer or shorter enum values, members or alternatives")
        if len(self.rules) >= MAX_RULES:
            raise self.fail(f"the grammar built from it needs over {MAX_RULES} rules",
                            "simplify the schema: fewer members, alternatives or $refs")
        self.rules[name] = body
        return name

    def define(self, hint: str, body: str) -> str:
        """A new rule for ``body``; a body that is one rule's name is that rule."""
        if body in self.rules and _NAME.fullmatch(body):
            return body
        return self.add(self.name(hint), body)

    def primitive(self, name: str) -> str:
        """The JSON building block ``name`` (and the blocks it uses), defined once."""
        if name not in self.rules:
            body, uses = PRIMITIVES[name]
            self.add(name, body)
            for dep in uses:
                self.primitive(dep)
        return name

    def text(self, root: str) -> str:
        """The grammar, ``root`` first."""
        if root != "root":
            self.rules["root"] = root
        lines = [f"root ::= {self.rules['root']}"]
        lines += [f"{k} ::= {v}" for k, v in self.rules.items() if k != "root"]
        return "\n".join(lines) + "\n"


def alternation(rules: Rules, hint: str, texts: Iterable[str]) -> str:
    """A rule matching exactly the strings ``texts``, built as a prefix tree.

    An alternation of N literals makes llama.cpp's sampler hold N stacks at the first character
    (and compare them pairwise); the tree holds one per distinct next character, whatever N is.
    Nodes are inline groups, and every :data:`_TREE_NESTING` levels a rule of their own."""
    root: dict[str, Any] = {}
    for text in texts:
        node = root
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = {}  # end of a text
    return rules.define(hint, _node_body(rules, hint, _compress(root)))


def _compress(node: dict[str, Any]) -> dict[str, Any]:
    """The tree with chains of single children merged into one edge (iteratively: a chain of a
    million characters is one edge, not a million frames)."""
    out: dict[str, Any] = {}
    stack: list[tuple[dict[str, Any], dict[str, Any]]] = [(node, out)]
    while stack:
        src, dst = stack.pop()
        for label, child in src.items():
            if label == "":
                dst[""] = {}
                continue
            while len(child) == 1 and "" not in child:
                (more, child), = child.items()
                label += more
            sub: dict[str, Any] = {}
            dst[label] = sub
            stack.append((child, sub))
    return out


def _node_body(rules: Rules, hint: str, node: dict[str, Any]) -> str:
    """The alternatives of ``node``, children first (post-order without recursion)."""
    bodies: dict[int, str] = {}
    stack: list[tuple[dict[str, Any], int, bool]] = [(node, 0, False)]
    while stack:
        cur, depth, expanded = stack.pop()
        if not expanded:
            stack.append((cur, depth, True))
            stack.extend((child, depth + 1, False) for label, child in cur.items() if label)
            continue
        alts = []
        for label, child in sorted(cur.items()):
            if not label:
                continue
            sub = bodies.pop(id(child))
            if not sub:
                alts.append(literal(label))
            elif depth and depth % _TREE_NESTING == 0:
                alts.append(f"{literal(label)} {rules.define(hint, sub)}")
            else:
                alts.append(f"{literal(label)} ({sub})")
        body = " | ".join(alts)
        if "" in cur and alts:
            body = f"({body})?"
        bodies[id(cur)] = body
    return bodies[id(node)]


RAW_CHAR = r'[^"\\\x7F\x00-\x1F]'


def other_key(rules: Rules, hint: str, names: Iterable[str]) -> str:
    """A rule for the JSON key of a member that is none of ``names`` (additionalProperties
    beside declared properties): keys written without escapes (an escape such as ``\\u0061``
    could spell a declared name), none equal to a declared one. One rule per node of the
    names' prefix tree, so the sampler's choices at each character stay few."""
    raw = rules.define("raw-char", RAW_CHAR)
    tree: dict[str, Any] = {}
    for name in names:
        if any(ch in '"\\' or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
            continue  # a key written without escapes can never equal it
        node = tree
        for ch in name:
            node = node.setdefault(ch, {})
        node[""] = {}
    ids = {id(tree): rules.name(hint)}
    queue = [tree]
    while queue:
        node = queue.pop()
        children = sorted(k for k in node if k)
        alts = []
        for ch in children:
            ids[id(node[ch])] = rules.name(hint)
            alts.append(f"{literal(ch)} {ids[id(node[ch])]}")
            queue.append(node[ch])
        excluded = "".join(_class_char(ch) for ch in children)
        alts.append(f'[^"\\\\\\x7F\\x00-\\x1F{excluded}] {raw}*')
        body = " | ".join(alts)
        # stopping here spells a proper prefix of a name (or no name): allowed unless a name
        rules.add(ids[id(node)], body if "" in node else f"({body})?")
    return rules.define(hint, f'"\\"" {ids[id(tree)]} "\\"" space')


def _class_char(ch: str) -> str:
    code = ord(ch)
    return f"\\U{code:08X}" if code > 0xFFFF else f"\\u{code:04X}" if code > 0x7E or \
        ch in "]\\-^" else ch  # fmt: skip

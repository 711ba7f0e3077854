"""A reply held to a JSON Schema, validated against the whole schema once it is complete
(issue 35).

The grammar holds most keywords while the model writes (:mod:`modeld.schema`); a few it cannot
(``uniqueItems``, ``multipleOf``, ``format: email``, a fractional bound), and a reply cut by
``max_tokens`` or a stop string is not complete JSON. So the daemon keeps the text of each
such reply, checks it when the runner is done (on a thread: a long reply's check would hold
its loop) and puts the result in the ``done`` body as ``validation``; every API passes it on.
Sources: a ``format`` (``"json"`` is any object) and a forced tool call (each call's
arguments against its tool's ``parameters``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modeld.wire.messages import Tool, forced_tool, forces_call, format_schema
from modeld.wire.replies import Validation, ValidationProblem

log = logging.getLogger("modeld.daemon")


@dataclass(eq=False)
class ReplyCheck:
    """What one reply is checked against, and its text as it arrives."""

    schema: dict[str, Any] | None = None  # a format's schema
    tools: dict[str, Any] = field(default_factory=dict)  # a forced call: name -> parameters
    parts: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        self.parts.append(text)

    def size(self) -> int:
        """Characters of the reply so far (a long one is checked on the lane of big work)."""
        return sum(map(len, self.parts))

    def result(self, done: Mapping[str, Any]) -> Validation:
        """The check of the complete reply (``done``: the runner's done body). Never raises:
        a bug here says the reply was not checked."""
        from modeld.schema.validate import parse, validate

        problems: list[ValidationProblem] = []
        unchecked: list[str] = []
        try:
            for at, text, schema in self._parts(done, problems):
                try:
                    value = parse(text)
                except (ValueError, RecursionError) as exc:
                    problems.append(_not_json(at, exc, done))
                    continue
                report = validate(value, schema)
                problems += [ValidationProblem(at=at + p.at, keyword=p.keyword,
                                               message=p.message) for p in report.errors]
                unchecked += report.unchecked
        except Exception:
            log.exception("validating a reply failed")
            problems = [ValidationProblem(at="", keyword="", message="not checked: an "
                                          "internal error (the daemon's log has it)")]
        return Validation(valid=not problems, errors=problems[:10], unchecked=unchecked)

    def _parts(self, done: Mapping[str, Any], problems: list[ValidationProblem]
               ) -> list[tuple[str, str, Any]]:
        """(where, JSON text, schema) of each part of the reply to check."""
        if self.schema is not None:
            return [("", "".join(self.parts), self.schema)]
        calls = done.get("tool_calls") or []
        if not calls:
            problems.append(ValidationProblem(
                at="/tool_calls", keyword="", message=f"the reply made no tool call{_cut(done)}"))
        out = []
        for i, call in enumerate(calls):
            name = call.get("name")
            if name not in self.tools:
                problems.append(ValidationProblem(at=f"/tool_calls/{i}/name", keyword="",
                                                  message=f"no tool is named {name!r}"))
                continue
            out.append((f"/tool_calls/{i}/arguments", str(call.get("arguments", "")),
                        self.tools[name]))
        return out


def _cut(done: Mapping[str, Any]) -> str:
    """Why a reply may have ended early (empty when it ended on its own)."""
    if done.get("finish_reason") == "length":
        return f" (cut at the {done.get('length_reason') or 'max_tokens'} limit)"
    if done.get("stop_sequence"):
        return " (cut by a stop string)"
    return ""


def _not_json(at: str, exc: BaseException, done: Mapping[str, Any]) -> ValidationProblem:
    why = "it nests too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
    return ValidationProblem(at=at, keyword="",
                             message=f"not complete JSON{_cut(done)}: {why}")


def for_request(fmt: str | dict[str, Any] | None, tools: Sequence[Tool],
                tool_choice: str) -> ReplyCheck | None:
    """The check of a reply to ``fmt`` or a forced call (None: the reply is free text)."""
    if forces_call(tools, tool_choice):
        only = forced_tool(tool_choice)
        return ReplyCheck(tools={t.name: t.schema() for t in tools
                                 if only is None or t.name == only})
    return None if fmt is None else ReplyCheck(schema=format_schema(fmt))

"""The HTTP reply driver's rules, each in one place (``modeld.http.reply``): the first-byte
rule, the stream's head and keep-alives, and the content rules (one tool call, thinking
joined). Pure logic: the steps are fed as the bridge yields them; a renderer that writes plain
bytes subclasses the real :class:`Renderer`. tests/test_http_firstbyte.py checks the same rule
through a real daemon on all four APIs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.responses import JSONResponse, Response

from modeld.errors import ModeldError, RunnerCrashedError
from modeld.http.reply import Renderer, Step, _Reply, committed, rendered


class Plain(Renderer):
    """Each part as a short readable line."""

    def __init__(self, head: list[bytes], keep: bytes = b"tick", one_call: bool = False
                 ) -> None:
        self._head, self._keep, self.one_call = head, keep, one_call

    def head(self) -> list[bytes]:
        return list(self._head)

    def tick(self) -> bytes:
        return self._keep

    def chunk(self, body: dict[str, Any]) -> list[bytes]:
        calls = ",".join(str(d["index"]) for d in body.get("tool_calls") or [])
        return [f"chunk {body.get('text', '')}|{calls}".encode()]

    def done(self, text: str, done: dict[str, Any]) -> list[bytes]:
        return [f"done {text}|{done.get('thinking', '')}|{len(done.get('tool_calls') or [])}"
                .encode()]

    def error(self, exc: ModeldError) -> list[bytes]:
        return [f"error {exc.code.value}".encode()]

    def whole(self, text: str, done: dict[str, Any]) -> Response:
        return JSONResponse({"text": text})

    def http_error(self, exc: ModeldError) -> Response:
        return JSONResponse({"error": exc.message}, status_code=500)


async def _items(steps: list[Step | BaseException]) -> AsyncIterator[Step]:
    for step in steps:
        if isinstance(step, BaseException):
            raise step
        yield step


async def _bytes(steps: list[Step | BaseException], r: Renderer) -> list[bytes]:
    out = []
    async for part in committed(rendered(_items(steps), r), r.error):
        out.append(part)
    return out


def run(steps: list[Step | BaseException], r: Renderer) -> list[bytes]:
    return asyncio.run(_bytes(steps, r))


def crash() -> RunnerCrashedError:
    return RunnerCrashedError("the runner died")


def test_an_error_before_the_first_byte_is_raised_for_an_http_status() -> None:
    with pytest.raises(RunnerCrashedError):
        run([crash()], Plain([]))
    # a reply that renders to nothing (its only call was not the first) sends no byte either
    one = Plain([], one_call=True)
    with pytest.raises(RunnerCrashedError):
        run([("chunk", {"text": "", "tool_calls": [{"index": 1}]}), crash()], one)


def test_an_error_after_the_first_byte_is_sent_in_the_stream() -> None:
    assert run([("chunk", {"text": "a"}), crash()], Plain([])) == [
        b"chunk a|", b"error runner_crashed"]
    # a keep-alive or a head is a first byte too: the status is already sent
    assert run([None, crash()], Plain([])) == [b"tick", b"error runner_crashed"]
    assert run([None, crash()], Plain([b"head"])) == [b"head", b"tick",
                                                     b"error runner_crashed"]


def test_the_head_opens_the_stream_once_and_ticks_follow_silence() -> None:
    steps: list[Step | BaseException] = [None, None, ("chunk", {"text": "a"}), None,
                                         ("done", {})]
    assert run(steps, Plain([b"head"])) == [b"head", b"tick", b"tick", b"chunk a|", b"tick",
                                            b"done a||0"]
    # a head that ends with its keep-alive (Anthropic's ping) is not followed by a second one
    assert run(steps, Plain([b"head", b"tick"])) == [b"head", b"tick", b"tick", b"chunk a|",
                                                     b"tick", b"done a||0"]
    assert run([("chunk", {"text": "a"}), ("done", {})], Plain([b"head"])) == [
        b"head", b"chunk a|", b"done a||0"]


def test_one_call_keeps_the_first_call_only_and_thinking_is_joined() -> None:
    calls = [{"index": 0, "id": "a", "name": "f"}, {"index": 1, "id": "b", "name": "g"}]
    steps: list[Step | BaseException] = [
        ("chunk", {"text": "", "thinking": "th"}),
        ("chunk", {"text": "x", "thinking": "ink", "tool_calls": calls}),
        ("chunk", {"text": "", "tool_calls": [{"index": 1, "arguments": "{}"}]}),
        ("done", {"tool_calls": [{"id": "a"}, {"id": "b"}]}),
    ]
    assert run(steps, Plain([], one_call=True)) == [
        b"chunk |", b"chunk x|0", b"done x|think|1"]  # the third chunk had only call 1
    assert run(steps, Plain([])) == [b"chunk |", b"chunk x|0,1", b"chunk |1", b"done x|think|2"]


def test_a_reply_read_whole_has_its_parts_joined() -> None:
    reply = _Reply(one_call=True, logprobs=True)
    reply.chunk({"text": "a", "logprobs": [{"token": "a"}]})
    reply.chunk({"text": "b", "thinking": "t", "tool_calls": [{"index": 1}]})
    text, done = reply.done({"tool_calls": [{"id": "1"}, {"id": "2"}]})
    assert text == "ab" and done["thinking"] == "t" and done["logprobs"] == [{"token": "a"}]
    assert done["tool_calls"] == [{"id": "1"}]
    text, done = _Reply(one_call=False, logprobs=False).done({"finish_reason": "stop"})
    assert text == "" and done == {"finish_reason": "stop"}  # nothing added that was not there

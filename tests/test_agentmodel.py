"""The scripted model of the real-agent tests (tests/agentmodel.py) behaves as its script says,
through a real daemon and the official SDKs, so that test_agents_real.py's checks mean what
they claim: it answers Hello with no marker, calls the agent's shell tool when asked, answers
with the result only when the tool's output holds ``RESULT``, and calls again otherwise (the
answer depends on what the tool printed, not on the turn count)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import agentmodel
from agentutil import Agent, start
from conftest import MODELS_DIR

Factory = Callable[..., Any]
BASH = {"name": "Bash", "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                         "required": ["command"]}}  # fmt: skip
EXEC = {"type": "function", "name": "exec_command", "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                       "required": ["cmd"]}}  # fmt: skip


def scripted(agent: Agent, which: str, vocab_source: Path) -> str:
    """The scripted model for ``which`` agent, in the daemon's models dir; its name."""
    path = agentmodel.cached_agent_model(MODELS_DIR, which, vocab_source)
    (agent.d.root / "models").mkdir(exist_ok=True)
    shutil.copyfile(path, agent.d.root / "models" / f"scripted-{which}.gguf")
    return f"scripted-{which}"


def _messages(agent: Agent, model: str, messages: list[dict[str, Any]]) -> Any:
    return agent.anthropic.messages.create(model=model, max_tokens=200, tools=[BASH],
                                           messages=messages)  # fmt: skip


def test_claude_script_over_messages(daemon_factory: Factory, default_model: Path) -> None:
    agent = start(daemon_factory)
    model = scripted(agent, "claude", default_model)
    hello = _messages(agent, model, [{"role": "user", "content": "Say hello"}])
    assert [b.text for b in hello.content] == [agentmodel.HELLO]
    assert hello.stop_reason == "end_turn"
    ask = {"role": "user", "content": f"Run it {agentmodel.TOOL}"}
    call = _messages(agent, model, [ask])
    assert call.stop_reason == "tool_use"
    [use] = call.content
    assert (use.type, use.name, use.input) == ("tool_use", "Bash", {"command": agentmodel.COMMAND})

    def after(output: str) -> Any:
        result = {"type": "tool_result", "tool_use_id": use.id, "content": output}
        return _messages(agent, model, [ask, {"role": "assistant", "content": call.content},
                                        {"role": "user", "content": [result]}])  # fmt: skip

    done = after("MODELD42\n")
    assert [b.text for b in done.content] == [agentmodel.DONE]
    again = after("MODELD41\n")  # another output: no answer, the call again
    assert again.stop_reason == "tool_use" and again.content[0].input == use.input


def test_codex_script_over_responses(daemon_factory: Factory, default_model: Path) -> None:
    agent = start(daemon_factory)
    model = scripted(agent, "codex", default_model)
    hello = agent.openai.responses.create(model=model, input="Say hello", tools=[EXEC])
    assert hello.output_text == agentmodel.HELLO
    ask = {"role": "user", "content": f"Run it {agentmodel.TOOL}"}
    call = agent.openai.responses.create(model=model, input=[ask], tools=[EXEC])
    [item] = call.output
    assert item.type == "function_call" and item.name == "exec_command"
    assert json.loads(item.arguments) == {"cmd": agentmodel.COMMAND}

    def after(output: str) -> Any:
        result = {"type": "function_call_output", "call_id": item.call_id, "output": output}
        history = [ask, item.model_dump(exclude_none=True), result]
        return agent.openai.responses.create(model=model, input=history, tools=[EXEC])

    assert after("MODELD42\n").output_text == agentmodel.DONE
    assert after("MODELD41\n").output[0].type == "function_call"


@pytest.mark.parametrize("which", ["claude", "codex"])
def test_replies_are_decided_in_the_weights(which: str, default_model: Path) -> None:
    """The build refuses a script it cannot write as asked: here it checks its own replay."""
    vocab = agentmodel.build_vocab(agentmodel.Vocab(*agentmodel.gemma_vocab(default_model)),
                                   [agentmodel.TOOL, agentmodel.RESULT])  # fmt: skip
    eos = vocab.ids["<|im_end|>"]
    layout = agentmodel.plan(vocab, agentmodel.agent_script(which), eos)
    w = agentmodel.weights(layout, len(vocab.tokens))
    for mode, text in zip([None, 0, 1], layout.written, strict=True):
        got, margin = agentmodel.replay(layout, w, mode, eos)
        assert b"".join(vocab.piece_text(t) for t in got[:-1]).decode() == text
        assert got[-1] == eos and margin >= 20
    assert json.loads(layout.written[1].removeprefix("<tool_call>").removesuffix("</tool_call>")
                      ) == agentmodel.CALLS[which]  # fmt: skip
    assert len(vocab.tokens) < 70_000  # a 32k-piece vocabulary plus gemma's alphabet

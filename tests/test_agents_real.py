"""The real Claude Code and Codex CLIs (pinned, from npm: tests/agentbins.py) against a real
daemon, started the way a user starts them: ``modeld launch claude|codex --exec -- …``.

Each agent, on the scripted model of tests/agentmodel.py: one answer; a second turn of the same
conversation that reads its prefix (the agent's whole ~7-21k-token system prompt and tools) from
the prompt cache; and one tool round trip — the model calls the agent's shell tool (Claude
Code's Bash, Codex's exec_command) with ``echo MODELD$((40+2))``, the agent runs it, and the
model answers "The command printed 42." only because ``MODELD42`` reached its prompt (the
shell computed it; test_agentmodel.py shows another output gets the call again).

What this proves: modeld's wire (Anthropic Messages, OpenAI Responses, streaming as each agent
asks), launch's environment and flags, chat templating and Hermes tool-call parsing as the
agents see them, the agents' tool loops, and prompt caching across their turns. What it does
not prove: anything about how a trained model copes with the agents' prompts — the replies are
fixed by the markers in the prompts. Cost: about a minute on 2 cores once installed (Claude
Code's first prompt is ~21k tokens), plus about 20 s and 660 MB for the first npm install.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import agentbins
import agentmodel
from agentutil import Agent, start
from cliutil import MODELD
from test_agentmodel import scripted

pytestmark = [pytest.mark.agents, pytest.mark.slow]
Factory = Callable[..., Any]
ASK = f"Run `{agentmodel.COMMAND}` with your shell tool {agentmodel.TOOL}"


@pytest.fixture(scope="module")
def bins() -> dict[str, Path]:
    return agentbins.install()


def _launch(agent: Agent, which: str, model: str, home: Path, bins: dict[str, Path],
            *args: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``modeld launch WHICH -m MODEL --exec -- ARGS`` in the daemon's environment, the agent
    on PATH, in its own HOME (and cwd, where both keep their sessions)."""
    env = {**agent.d.env, "HOME": str(home), "CODEX_HOME": str(home / ".codex"),
           "DISABLE_AUTOUPDATER": "1", "NO_COLOR": "1",
           "PATH": f"{bins[which].parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    done = subprocess.run([MODELD, "launch", which, "-m", model, "--exec", "--", *args],
                          env=env, cwd=home, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, f"{which} {args}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_claude_code(daemon_factory: Factory, default_model: Path, bins: dict[str, Path],
                     tmp_path: Path) -> None:  # fmt: skip
    agent = start(daemon_factory)
    model = scripted(agent, "claude", default_model)

    def claude(*args: str) -> Any:
        out = _launch(agent, "claude", model, tmp_path, bins, "-p", *args,
                      "--output-format", "json").stdout  # fmt: skip
        return json.loads(out)

    first = claude("Reply with one word: hello")
    assert (first["result"], first["is_error"]) == (agentmodel.HELLO, False)
    prompt = first["usage"]["input_tokens"] + first["usage"]["cache_read_input_tokens"]
    assert prompt > 5000  # Claude Code's own system prompt and tools
    second = claude("--continue", "Say it again")
    assert second["result"] == agentmodel.HELLO
    assert second["usage"]["cache_read_input_tokens"] >= prompt - 8  # the first turn's prompt
    assert second["usage"]["input_tokens"] < 200  # only the new turn was evaluated
    run = _launch(agent, "claude", model, tmp_path, bins, "-p", ASK, "--allowedTools",
                  "Bash(echo:*)", "--output-format", "stream-json", "--verbose").stdout
    events = [json.loads(line) for line in run.splitlines() if line.startswith("{")]
    blocks = [b for e in events if e.get("type") in ("assistant", "user")
              for b in e["message"]["content"] if isinstance(b, dict)]  # fmt: skip
    uses = [b for b in blocks if b["type"] == "tool_use"]
    assert [(u["name"], u["input"]) for u in uses] == [("Bash", {"command": agentmodel.COMMAND})]
    [result] = [b for b in blocks if b["type"] == "tool_result"]
    assert result["tool_use_id"] == uses[0]["id"] and not result.get("is_error")
    assert agentmodel.RESULT in json.dumps(result["content"])  # what the shell printed
    [end] = [e for e in events if e.get("type") == "result"]
    assert (end["result"], end["num_turns"]) == (agentmodel.DONE, 2)


def test_codex(daemon_factory: Factory, default_model: Path, bins: dict[str, Path],
               tmp_path: Path) -> None:  # fmt: skip
    agent = start(daemon_factory)
    model = scripted(agent, "codex", default_model)
    # danger-full-access: CI containers often lack the user namespaces Codex's sandbox needs
    flags = ("--json", "--skip-git-repo-check", "-c", 'sandbox_mode="danger-full-access"')

    def codex(*args: str) -> list[dict[str, Any]]:
        out = _launch(agent, "codex", model, tmp_path, bins, "exec", *args).stdout
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def items(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
        return [e["item"] for e in events
                if e.get("type") == "item.completed" and e["item"]["type"] == kind]  # fmt: skip

    def usage(events: list[dict[str, Any]]) -> dict[str, int]:
        [done] = [e for e in events if e.get("type") == "turn.completed"]
        return dict(done["usage"])

    first = codex(*flags, "Reply with one word: hello")
    assert [m["text"] for m in items(first, "agent_message")] == [agentmodel.HELLO]
    prompt = usage(first)["input_tokens"]
    assert prompt > 3000  # Codex's own instructions and tools
    [thread] = [e["thread_id"] for e in first if e.get("type") == "thread.started"]
    second = codex("resume", *flags, thread, "Say it again")
    assert [m["text"] for m in items(second, "agent_message")] == [agentmodel.HELLO]
    # a resumed thread's usage adds up all its turns: this turn is the difference
    fresh = usage(second)["input_tokens"] - prompt
    cached = usage(second)["cached_input_tokens"] - usage(first)["cached_input_tokens"]
    assert cached >= prompt - 8  # the first turn's prompt
    assert fresh - cached < 200  # only the new turn was evaluated
    run = codex(*flags, ASK)
    [command] = items(run, "command_execution")
    assert agentmodel.COMMAND in command["command"] and command["exit_code"] == 0
    assert command["aggregated_output"].strip() == agentmodel.RESULT
    assert [m["text"] for m in items(run, "agent_message")] == [agentmodel.DONE]

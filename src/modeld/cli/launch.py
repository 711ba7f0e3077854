"""``modeld launch claude|codex``: the environment (and, for Codex, the provider flags) that
point a coding agent at this daemon's HTTP front door, printed for a shell or used to run the
agent (``--exec``).

Claude Code reads ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_AUTH_TOKEN`` (sent as a Bearer key)
and a model name per tier; ``CLAUDE_CODE_ATTRIBUTION_HEADER=0`` keeps its per-request billing
line out of the system prompt (modeld drops that line anyway, so the prompt cache holds), and
``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` stops its telemetry calls to the base URL.
Codex speaks the Responses API through a provider declared with ``-c`` flags (a custom
provider, so no OpenAI login is asked for); the key it sends comes from ``OPENAI_API_KEY``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from modeld.errors import InvalidRequestError

if TYPE_CHECKING:  # the CLI imports this module at start-up: nothing more than it needs
    from modeld.config import Settings

AGENTS = ("claude", "codex")
#: The key an agent sends when the daemon needs none (both agents insist on some key).
DUMMY_KEY = "modeld"


def base_url(settings: Settings) -> str:
    """The front door's URL as a client on this machine reaches it."""
    address = settings.http_address
    if address is None:
        raise InvalidRequestError("the HTTP front door is off (http = off)",
                                  hint="set http = \"127.0.0.1:11434\" in the config or "
                                       "MODELD_HTTP, and restart the daemon")  # fmt: skip
    host, port = address
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def agent_env(agent: str, settings: Settings, model: str) -> tuple[dict[str, str], list[str]]:
    """(environment variables, arguments) that point ``agent`` at this daemon."""
    url, key = base_url(settings), settings.api_key or DUMMY_KEY
    if agent == "claude":
        env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": key, "ANTHROPIC_API_KEY": "",
               "ANTHROPIC_MODEL": model, "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
               "ANTHROPIC_DEFAULT_SONNET_MODEL": model, "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
               "CLAUDE_CODE_SUBAGENT_MODEL": model, "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}  # fmt: skip
        return env, []
    if agent == "codex":
        provider = "model_providers.modeld"
        args = ["-c", 'model_provider="modeld"', "-c", f'{provider}.name="modeld"',
                "-c", f'{provider}.base_url="{url}/v1"', "-c", f'{provider}.wire_api="responses"',
                "-c", f'{provider}.env_key="OPENAI_API_KEY"', "-m", model]  # fmt: skip
        return {"OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": key}, args
    raise InvalidRequestError(f"unknown agent {agent!r}", hint=f"one of: {', '.join(AGENTS)}")


def launch(
    agent: Annotated[str, typer.Argument(help="claude (Claude Code) or codex (Codex CLI).")],
    args: Annotated[list[str] | None, typer.Argument(
        help="Arguments passed on to the agent (after --).")] = None,
    model: Annotated[str, typer.Option("--model", "-m",
                                       help="The model the agent uses.")] = "default",
    run: Annotated[bool, typer.Option("--exec",
                                      help="Run the agent with this environment.")] = False,
) -> None:
    """Point Claude Code or Codex at this daemon: print the environment, or run the agent."""
    from modeld.config import load_settings

    settings, _ = load_settings()
    env, flags = agent_env(agent, settings, model)
    if not run:
        for name, value in env.items():
            typer.echo(f"export {name}={shlex.quote(value)}")
        typer.echo(shlex.join([agent, *flags, *(args or [])]))
        return
    program = shutil.which(agent)
    if program is None:
        raise InvalidRequestError(f"{agent} is not on PATH",
                                  hint="install it, or run without --exec and start it "
                                       "yourself with the environment printed")  # fmt: skip
    sys.stdout.flush()
    os.execve(program, [agent, *flags, *(args or [])], {**os.environ, **env})

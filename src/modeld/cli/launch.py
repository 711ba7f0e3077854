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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from modeld.errors import InvalidRequestError

if TYPE_CHECKING:  # the CLI imports this module at start-up: nothing more than it needs
    from modeld.config import Settings

AGENTS = ("claude", "codex")
#: The key an agent sends when the daemon needs none (both agents insist on some key).
DUMMY_KEY = "modeld"


def _url(host: str, port: int) -> str:
    """The URL a client on this machine reaches ``host:port`` at (a wildcard is loopback)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def base_url(settings: Settings) -> str:
    """The front door's URL as configured (what a daemon started now would listen on)."""
    address = settings.http_address
    if address is None:
        raise InvalidRequestError("the HTTP front door is off (http = off)",
                                  hint="set http = \"127.0.0.1:11434\" in the config or "
                                       "MODELD_HTTP, and restart the daemon")  # fmt: skip
    return _url(*address)


@dataclass(frozen=True)
class Target:
    """Where the agent finds the model: the front door's URL and the model's context (the
    most a conversation can grow to, ``show``'s ``n_ctx_max``; None when not known)."""

    url: str
    context: int | None = None
    note: str = ""  # said on stderr: no daemon runs, the context is unknown, ...


def find_target(settings: Settings, model: str) -> Target:
    """The running daemon's own front door (its port, not the configured one: a daemon started
    with ``serve --http HOST:PORT`` listens elsewhere) and the context it would give ``model``.
    With no daemon on the user's socket, one is started there as ``modeld run`` starts it
    (unless ``MODELD_NO_AUTOSTART``: then it refuses): never the configured port unchecked,
    which on a shared machine may be another user's daemon."""
    from modeld.cli.opts import connect
    from modeld.errors import DaemonUnavailableError

    ref = None if model == "default" else model
    try:  # a daemon started with the front door off would not serve the agent
        client = connect(settings, autostart=settings.http_address is not None)
    except DaemonUnavailableError as exc:
        base_url(settings)  # http = off: says so
        raise DaemonUnavailableError(
            f"no modeld daemon is running for this user ({exc.message})",
            hint="start it with 'modeld serve' (or unset MODELD_NO_AUTOSTART so launch starts "
                 "it), then run launch again", details=exc.details) from None
    try:
        stats = client.stats()
        address = stats.get("http_address")
        if not isinstance(address, str):
            raise InvalidRequestError(
                "the running daemon has no HTTP front door (http = off, or its port was "
                "taken: see its log)",
                hint="restart it with an HTTP address: modeld serve --http 127.0.0.1:11434")
        host, _, port = address.rpartition(":")
        url = _url(host.strip("[]"), int(port))
        show = _quiet(lambda: client.show(ref))
    finally:
        client.close()
    context = show.get("n_ctx_max") if show else None
    note = ""
    if not isinstance(context, int):
        context = None
        note = (f"the context of {model} is not known here (the agent assumes its own "
                "default)")
    return Target(url, context, note)


def _quiet(show: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    from modeld.errors import ModeldError

    try:
        return show()
    except ModeldError:
        return None


def agent_env(agent: str, settings: Settings, model: str, target: Target | None = None
              ) -> tuple[dict[str, str], list[str]]:
    """(environment variables, arguments) that point ``agent`` at this daemon (``target``:
    its URL and the model's context; None: the configured address, context not told)."""
    target = target or Target(base_url(settings))
    url, key, window = target.url, settings.api_key or DUMMY_KEY, target.context
    if agent == "claude":
        env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": key, "ANTHROPIC_API_KEY": "",
               "ANTHROPIC_MODEL": model, "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
               "ANTHROPIC_DEFAULT_SONNET_MODEL": model, "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
               "CLAUDE_CODE_SUBAGENT_MODEL": model, "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}  # fmt: skip
        if window is not None:  # its window for a model not named claude-*, and when to compact
            env.update(CLAUDE_CODE_DISABLE_1M_CONTEXT="1",
                       CLAUDE_CODE_MAX_CONTEXT_TOKENS=str(window),
                       CLAUDE_CODE_AUTO_COMPACT_WINDOW=str(window),
                       CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(reply_room(window)))
        return env, []
    if agent == "codex":
        provider = "model_providers.modeld"
        args = ["-c", 'model_provider="modeld"', "-c", f'{provider}.name="modeld"',
                "-c", f'{provider}.base_url="{url}/v1"', "-c", f'{provider}.wire_api="responses"',
                "-c", f'{provider}.env_key="OPENAI_API_KEY"']  # fmt: skip
        if window is not None:
            args += ["-c", f"model_context_window={window}",
                     "-c", f"model_auto_compact_token_limit={window - reply_room(window)}"]
        return {"OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": key}, [*args, "-m", model]
    raise InvalidRequestError(f"unknown agent {agent!r}", hint=f"one of: {', '.join(AGENTS)}")


def shell_lines(agent: str, env: dict[str, str], flags: list[str], args: list[str]
                ) -> list[str]:
    """What ``launch`` prints without ``--exec``: one export per variable, then the command."""
    return [*(f"export {name}={shlex.quote(value)}" for name, value in env.items()),
            shlex.join([agent, *flags, *args])]


def reply_room(window: int) -> int:
    """Tokens an agent keeps for a reply in a ``window``-token context: a quarter, at most
    Claude Code's own 32,000 (it compacts when the rest is full)."""
    return max(256, min(32000, window // 4))


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
    if agent not in AGENTS:
        raise InvalidRequestError(f"unknown agent {agent!r}", hint=f"one of: {', '.join(AGENTS)}")
    target = find_target(settings, model)
    env, flags = agent_env(agent, settings, model, target)
    if target.note:
        typer.echo(f"modeld: {target.note}", err=True)
    if not run:
        for line in shell_lines(agent, env, flags, args or []):
            typer.echo(line)
        return
    program = shutil.which(agent)
    if program is None:
        raise InvalidRequestError(f"{agent} is not on PATH",
                                  hint="install it, or run without --exec and start it "
                                       "yourself with the environment printed")  # fmt: skip
    sys.stdout.flush()
    os.execve(program, [agent, *flags, *(args or [])], {**os.environ, **env})

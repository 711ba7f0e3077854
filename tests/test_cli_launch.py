"""``modeld launch claude|codex``: the printed environment, and ``--exec`` running an agent
that reaches a real daemon with it. The agents here are stand-ins on PATH (Claude Code and
Codex are not installed): small scripts that read exactly what the real ones read (Claude
Code's ANTHROPIC_* variables; Codex's ``-c model_providers…`` flags and its env_key) and make
one request with the official client."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agentutil import free_port, start
from cliutil import MODELD, CliEnv

Factory = Callable[..., Any]

CLAUDE = """\
import json, os, sys, anthropic
c = anthropic.Anthropic(base_url=os.environ["ANTHROPIC_BASE_URL"],
                        auth_token=os.environ["ANTHROPIC_AUTH_TOKEN"], api_key=None)
n = c.messages.count_tokens(model=os.environ["ANTHROPIC_MODEL"],
                            messages=[{"role": "user", "content": "hi"}])
print(json.dumps({"argv": sys.argv[1:], "input_tokens": n.input_tokens,
                  "env": {k: v for k, v in os.environ.items() if k.startswith(("ANTHROPIC",
                                                                              "CLAUDE"))}}))
"""

CODEX = """\
import json, os, sys, tomllib, openai
args, conf, model = sys.argv[1:], {}, None
while args:
    flag, value, args = args[0], args[1], args[2:]
    if flag == "-c":
        key, raw = value.split("=", 1)
        conf[key] = tomllib.loads("v = " + raw)["v"]
    elif flag == "-m":
        model = value
provider = "model_providers." + conf["model_provider"]
assert conf[provider + ".wire_api"] == "responses"
c = openai.OpenAI(base_url=conf[provider + ".base_url"],
                  api_key=os.environ[conf[provider + ".env_key"]], max_retries=0)
r = c.responses.create(model=model, input="hi", max_output_tokens=2, temperature=0)
print(json.dumps({"status": r.status, "output_tokens": r.usage.output_tokens,
                  "context_window": conf.get("model_context_window")}))
"""


def _stand_in(bin_dir: Path, name: str, source: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!{sys.executable}\n{source}")
    path.chmod(0o755)


def _modeld(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MODELD, *args], capture_output=True, text=True, timeout=120,
                          env=env, check=False)


def test_launch_without_a_daemon_refuses_instead_of_guessing_a_port(tmp_path: Path) -> None:
    """Printing the configured port unchecked could point an agent at another user's daemon
    on a shared machine: with autostart off, launch refuses and says how to start one."""
    (tmp_path / "none.toml").touch()
    env = {**os.environ, "MODELD_CONFIG": str(tmp_path / "none.toml"),
           "MODELD_RUNTIME_DIR": str(tmp_path / "run"),
           "MODELD_SOCKET": f"ipc://{tmp_path / 'run' / 'modeld.sock'}",
           "MODELD_HTTP": "0.0.0.0:11500", "MODELD_NO_AUTOSTART": "1"}
    out = _modeld("launch", "claude", "--model", "qwen3", env=env)
    assert out.returncode == 3 and out.stdout == "", out.stderr  # nothing to point an agent at
    assert "no modeld daemon is running" in out.stderr and "modeld serve" in out.stderr
    off = _modeld("launch", "claude", env={**env, "MODELD_HTTP": "off"})
    assert off.returncode != 0 and "front door is off" in off.stderr
    unknown = _modeld("launch", "cursor", env=env)
    assert unknown.returncode != 0 and "claude, codex" in unknown.stderr


def test_launch_starts_the_users_own_daemon_and_names_its_port(tiny_model: Path) -> None:
    fresh = CliEnv.create(autostart=True)
    try:
        port = free_port()
        out = fresh.run("launch", "codex", "-m", str(tiny_model),
                        env_extra={"MODELD_HTTP": f"127.0.0.1:{port}"})
        assert out.returncode == 0, out.stderr
        match = re.search(r"started the daemon in the background \(pid (\d+)", out.stderr)
        assert match, out.stderr
        fresh.extra_cleanup.append(int(match.group(1)))
        assert f'base_url="http://127.0.0.1:{port}/v1"' in out.stdout.splitlines()[-1]
        assert f"model_context_window={2048}" in out.stdout  # the tiny model's training context
        assert fresh.json("stop")["stopped"] is True
    finally:
        fresh.cleanup()


def test_the_environment_points_each_agent_at_the_front_door() -> None:
    from modeld.cli.launch import Target, agent_env, base_url, shell_lines
    from modeld.config import Settings

    settings = Settings(http="0.0.0.0:11500", api_key="s3cret")
    assert base_url(settings) == "http://127.0.0.1:11500"  # reachable, not 0.0.0.0
    env, flags = agent_env("claude", settings, "qwen3", Target(base_url(settings)))
    lines = shell_lines("claude", env, flags, [])
    exported = dict(shlex.split(line)[1].split("=", 1) for line in lines[:-1])
    assert exported["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:11500"
    assert exported["ANTHROPIC_AUTH_TOKEN"] == "s3cret"  # the daemon's key when it has one
    assert exported["ANTHROPIC_MODEL"] == exported["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "qwen3"
    assert exported["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0" and lines[-1] == "claude"
    assert "CLAUDE_CODE_MAX_CONTEXT_TOKENS" not in exported  # no context known: not told
    keyless = Settings(http="127.0.0.1:11500")
    env, flags = agent_env("codex", keyless, "default", Target(base_url(keyless), 32768))
    codex = shell_lines("codex", env, flags, [])
    assert "export OPENAI_API_KEY=modeld" in codex  # a dummy key: Codex wants one
    assert 'wire_api="responses"' in codex[-1]
    assert " -c model_context_window=32768 " in codex[-1]
    env, flags = agent_env("codex", keyless, "qwen3", Target(base_url(keyless)))
    assert "model_context_window" not in shell_lines("codex", env, flags, [])[-1]


def test_launch_exec_runs_agents_that_reach_the_daemon(daemon_factory: Factory,
                                                      default_model: Path,
                                                      tmp_path: Path) -> None:
    agent = start(daemon_factory)
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "claude", CLAUDE)
    _stand_in(bin_dir, "codex", CODEX)
    # the configured port is not the one the daemon listens on: launch asks the daemon
    env = {**agent.d.env, "MODELD_HTTP": "127.0.0.1:1",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    models = httpx.get(f"{agent.base}/v1/models", timeout=60).json()["data"]
    default = next(m for m in models if m["id"] == "default")
    window = default["max_context_length"]
    assert window == 32768 and 256 <= default["context_length"] <= window  # gemma-3-270m
    show = httpx.post(f"{agent.base}/api/show", json={"model": "default"}, timeout=60).json()
    assert show["modeld"]["n_ctx_max"] == window
    assert show["parameters"] == f"num_ctx {show['modeld']['n_ctx']}"
    assert show["model_info"]["gemma3.context_length"] == 32768
    claude = _modeld("launch", "claude", "--exec", "--", "-p", "hello", env=env)
    assert claude.returncode == 0, claude.stderr
    seen = json.loads(claude.stdout)
    assert seen["argv"] == ["-p", "hello"] and seen["input_tokens"] > 0
    assert seen["env"]["ANTHROPIC_MODEL"] == "default"
    assert seen["env"]["ANTHROPIC_BASE_URL"] == agent.base
    assert seen["env"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(window)
    assert seen["env"]["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == str(window)
    assert seen["env"]["CLAUDE_CODE_DISABLE_1M_CONTEXT"] == "1"
    assert int(seen["env"]["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) == window // 4
    codex = _modeld("launch", "codex", "--exec", env=env)
    assert codex.returncode == 0, codex.stderr
    ran = json.loads(codex.stdout)
    assert ran["output_tokens"] > 0 and ran["context_window"] == window
    printed = _modeld("launch", "codex", env=env).stdout.splitlines()[-1]
    assert f"model_context_window={window}" in printed and agent.base in printed
    missing = _modeld("launch", "claude", "--exec", env={**env, "PATH": str(tmp_path / "no")})
    assert missing.returncode != 0 and "not on PATH" in missing.stderr


def test_readme_shows_exactly_what_launch_prints() -> None:
    """The README's block is what launch prints for a daemon on the default port (the
    environment and flags as :func:`agent_env` makes them; the context figures are this
    machine's: the default model's 32768 where memory allows)."""
    from modeld.cli.launch import Target, agent_env, base_url, shell_lines
    from modeld.config import Settings
    from modeld.describe import describe_local

    settings = Settings(http="127.0.0.1:11434")
    target = Target(base_url(settings), describe_local(settings, None).get("n_ctx_max"))
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Use with Claude Code / Codex", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", "")
    claude_part, codex_part = block.split("# Codex", 1)
    lines = [line.split("  #", 1)[0].rstrip() for line in claude_part.splitlines()
             if line and not line.startswith("#")]
    assert _numbers(lines) == _numbers(shell_lines("claude", *agent_env(
        "claude", settings, "default", target), []))
    codex = shell_lines("codex", *agent_env("codex", settings, "default", target), [])
    shown = [" ".join(line.split()) for line in codex_part.splitlines()[1:] if line]
    assert codex[:-1] == shown[:-1]  # the exports
    assert shlex.split(_numbers(shown)[-1]) == shlex.split(_numbers(codex)[-1])


def _numbers(lines: list[str]) -> list[str]:
    return [re.sub(r"=\d+", "=N", line) for line in lines]

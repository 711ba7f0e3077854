"""``modeld run``: one streamed reply, or a multi-turn chat on a terminal.

Kept out of cli/app.py so the command's behaviour (prompt from arguments and stdin, streaming,
``--json``, Ctrl-C) is one readable unit. Output contract: on a pipe, stdout carries exactly the
generated text; everything else (spinner, timings, hints) goes to stderr.
"""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modeld.cli import render
from modeld.cli.stdin import read_stdin_prompt
from modeld.errors import InvalidRequestError, ModelNotFoundError

if TYPE_CHECKING:
    from modeld.client import Client, Generation
    from modeld.config import Settings

BYE = {"/bye", "/exit", "/quit"}


@dataclass(frozen=True)
class RunOptions:
    system: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    keep_alive: str | None = None
    n_ctx: int | None = None
    raw: bool = False
    json_out: bool = False
    verbose: bool = False
    format: str | None = None  # "json" or the path of a JSON Schema file
    think: bool | None = None
    rpc: str | None = None  # llama.cpp RPC workers to load the model with first
    gpu_layers: int | None = None  # layers on the GPUs (-1: as many as fit; None: as loaded)
    images: tuple[Path, ...] = ()  # image files shown with the prompt
    mmproj: str | None = None  # the image projector to load the model with first

    def image_data(self) -> list[bytes]:
        """``--image`` files, read and checked (they travel as binary frames)."""
        from modeld.wire import images

        out = []
        for path in self.images:
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise InvalidRequestError(f"--image {path}: {exc.strerror or exc}",
                                          hint="give the path of an image file") from None
            images.check(data, f"--image {path}", InvalidRequestError)
            out.append(data)
        images.check_count(len(out), InvalidRequestError)
        return out

    def output_format(self) -> str | dict[str, Any] | None:
        """``--format``: "json", or the JSON Schema read from the file it names."""
        if self.format in (None, "json"):
            return self.format
        import json

        from modeld.wire.textcheck import check_text, too_deep

        try:
            with open(self.format, encoding="utf-8") as f:
                schema = json.load(f)
        except (OSError, ValueError) as exc:
            raise InvalidRequestError(f"--format {self.format}: cannot read a JSON Schema: "
                                      f"{exc}", hint='give "json" or a JSON Schema file') from None
        except RecursionError:
            deep = too_deep()
            raise InvalidRequestError(f"--format {self.format}: {deep.message}", hint=deep.hint,
                                      details=deep.details) from None
        if not isinstance(schema, dict):
            raise InvalidRequestError(f"--format {self.format}: the file is not a JSON object",
                                      hint="a JSON Schema is an object")
        check_text(schema, "--format")  # deep nesting: its 400 here, not a RecursionError later
        return schema

    def sampling(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop,
        }


def split_model_and_prompt(
    settings: Settings, first: str | None, second: str | None
) -> tuple[str | None, str | None]:
    """Tell ``run MODEL PROMPT`` from ``run PROMPT`` (default model).

    One argument is a model when it resolves to one; otherwise, if it cannot be a model name
    (whitespace, or characters no name has: ``Summarise:``, ``Why?``), it is the prompt for the
    default model. A single unknown word that could be a name is an error, never silently sent
    as a prompt: ``modeld run default WORD`` does that explicitly.
    """
    from modeld.registry import looks_like_path, resolve

    if first in (None, "", "default"):
        return None, second
    assert first is not None
    if second is not None:
        return first, second
    try:
        resolve(first, settings)
        return first, None
    except ModelNotFoundError as exc:
        if looks_like_path(first) or _could_be_a_name(first):
            exc.hint = (exc.hint + "; " if exc.hint else "") + (
                f"to send it as a prompt to the default model: modeld run default {first!r}"
            )
            raise
        return None, first


def _could_be_a_name(word: str) -> bool:
    """A model name, alias or Ollama-style ``name:tag``: letters, digits and ``._+-``, with
    at most one ``:`` between two such parts (``Summarise:`` is a prompt, ``qwen:7b`` a name)."""
    import re

    return re.fullmatch(r"[\w.+-]+(:[\w.+-]+)?", word) is not None


def _load_on_workers(client: Client, model: str | None, opts: RunOptions) -> Client:
    """``--rpc``: load the model on those llama.cpp RPC workers first (one loaded otherwise
    reloads there); ``--mmproj``: with that image projector."""
    if opts.rpc is not None or opts.mmproj is not None:
        from modeld.rpc.endpoints import parse_endpoints

        mmproj = os.path.abspath(os.path.expanduser(opts.mmproj)) if opts.mmproj else opts.mmproj
        client.load(model, n_ctx=opts.n_ctx, keep_alive=opts.keep_alive, mmproj=mmproj,
                    rpc=None if opts.rpc is None else parse_endpoints(opts.rpc),
                    gpu_layers=opts.gpu_layers)  # fmt: skip
    return client


def run_command(
    settings: Settings,
    first: str | None,
    second: str | None,
    opts: RunOptions,
    connect: Callable[[], Client],
) -> None:
    from modeld.registry import normalize_ref
    from modeld.wire.textcheck import from_argv

    model, prompt = split_model_and_prompt(settings, first, second)
    if prompt is not None:
        prompt = from_argv(prompt, "the prompt argument")
    model = normalize_ref(model)  # ./m.gguf means the caller's cwd, not the daemon's
    piped = read_stdin_prompt()
    if prompt and piped:
        prompt = f"{prompt}\n\n{piped}"
    elif piped:
        prompt = piped
    if prompt is None and opts.images:
        raise InvalidRequestError("--image needs a prompt to go with it",
                                  hint='modeld run MODEL "what is this?" --image photo.jpg')
    if prompt is None:
        if sys.stdin is not None and sys.stdin.isatty() and not opts.json_out:
            chat_loop(_load_on_workers(connect(), model, opts), model, opts)
            return
        raise InvalidRequestError(
            "no prompt given", hint='pass one as an argument or on stdin: echo "hi" | modeld run'
        )
    images = opts.image_data()
    client = _load_on_workers(connect(), model, opts)
    messages: list[dict[str, Any]] = _messages(opts.system, [("user", prompt)])
    if images:
        messages[-1]["images"] = images
    gen = _start(client, model, prompt, messages, opts)
    try:
        text = _stream(gen, echo=not opts.json_out)
    except BrokenPipeError:
        return  # the reader went away (`| head`): the generation is cancelled, exit quietly
    if opts.json_out:
        render.emit_json("run", {"model": model or "default", "text": text, "done": gen.done or {}})
    elif sys.stdout.isatty() and not text.endswith("\n"):
        sys.stdout.write("\n")
    if opts.format and gen.done is not None and gen.done.get("finish_reason") == "length":
        render.message("modeld: the reply was cut at the token limit before it was complete, "
                       "so it may not parse; raise --max-tokens")
    valid = _validation(gen.done or {}) if opts.format else True
    if opts.verbose:
        _timings(gen.done or {})
    if not valid:
        from modeld.errors import ExitCode

        raise SystemExit(int(ExitCode.INVALID_REPLY))


def _validation(done: Mapping[str, Any]) -> bool:
    """Say on stderr how the reply to ``--format`` failed its schema, and which formats were
    not checked; whether it is valid (the daemon validated it: docs/protocol.md)."""
    check = done.get("validation")
    if not isinstance(check, dict):
        return True
    for what in check.get("unchecked") or []:
        render.message(f"modeld: not checked (no check for it): {what}")
    if check.get("valid", True):
        return True
    render.message("modeld: the reply does not validate against the schema:")
    for problem in check.get("errors") or []:
        keyword = f" ({problem.get('keyword')})" if problem.get("keyword") else ""
        render.message(f"  {problem.get('at') or '/'}: {problem.get('message')}{keyword}")
    return False


def _messages(system: str | None, turns: list[tuple[str, str]]) -> list[dict[str, str]]:
    out = [{"role": "system", "content": system}] if system else []
    out.extend({"role": role, "content": content} for role, content in turns)
    return out


def _start(
    client: Client,
    model: str | None,
    prompt: str,
    messages: list[dict[str, Any]],
    opts: RunOptions,
) -> Generation:
    common: dict[str, Any] = {"keep_alive": opts.keep_alive, "n_ctx": opts.n_ctx,
                              "format": opts.output_format(), "gpu_layers": opts.gpu_layers,
                              **opts.sampling()}  # fmt: skip
    if opts.raw:
        text = f"{opts.system}\n\n{prompt}" if opts.system else prompt
        images = [base64.b64decode(m) for m in messages[-1].get("images", ())]
        return client.generate(model, text, raw=True, images=images, **common)
    gen = client.chat(model, messages, think=opts.think, **common)
    if sys.stderr.isatty() and not opts.json_out:
        gen.on_thinking = render.thinking  # dimmed on the terminal; never on stdout
    return gen


def _stream(gen: Generation, *, echo: bool) -> str:
    """Write chunks to stdout as they arrive; a spinner on stderr until the first one."""
    parts: list[str] = []
    with render.status("waiting for the model…") as spinner:
        for chunk in gen:
            spinner.stop()
            parts.append(chunk)
            if echo:
                try:
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
                except BrokenPipeError:
                    gen.close()  # cancel now rather than when the daemon notices we are gone
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                    raise
    return "".join(parts)


def _timings(done: Mapping[str, Any]) -> None:
    timings = done.get("timings", {}) if isinstance(done.get("timings"), dict) else done
    usage = done.get("usage", {}) if isinstance(done.get("usage"), dict) else done
    fields = {**usage, **timings}
    keys = (
        "load_s",
        "prompt_tokens",
        "prompt_tokens_reused",
        "prompt_eval_s",
        "completion_tokens",
        "generation_s",
        "tokens_per_s",
    )
    parts = []
    for key in keys:
        value = fields.get(key)
        if isinstance(value, float):
            parts.append(f"{key}={value:.3f}")
        elif value is not None:
            parts.append(f"{key}={value}")
    render.message("modeld: " + " ".join(parts))


def chat_loop(client: Client, model: str | None, opts: RunOptions) -> None:
    """A multi-turn chat on a terminal: the conversation is kept; /bye or Ctrl-D ends it."""
    render.message("modeld: chat started — /bye or Ctrl-D to exit, Ctrl-C stops a reply")
    turns: list[tuple[str, str]] = []
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            sys.stdout.write("\n")
            return
        except KeyboardInterrupt:
            sys.stdout.write("\nUse Ctrl-D or /bye to exit.\n")
            continue
        if line.strip() in BYE:
            return
        if not line.strip():
            continue
        turns.append(("user", line))
        gen = _start(client, model, line, _messages(opts.system, turns), opts)
        try:
            reply = _stream(gen, echo=True)
        except KeyboardInterrupt:
            gen.close()
            turns.pop()
            sys.stdout.write("\n")
            continue
        turns.append(("assistant", reply))
        sys.stdout.write("\n" if reply.endswith("\n") else "\n\n")
        if opts.verbose:
            _timings(gen.done or {})

"""Chat formatting: turn a list of chat messages into the prompt text a model expects.

Why this exists: llama-cpp-python falls back to the llama-2 format when a GGUF has no chat
template, which is wrong for most models; gemma-3-270m (the default model) ships without one.
The choice, in order: an explicit override; the GGUF's own Jinja template; a known format for the
architecture (Gemma, ChatML for Qwen); else a plain completion format. Pure: rendering a Jinja
template is done by a ``render`` callable the runner passes in (llama-cpp-python's formatter), so
this module imports nothing native and its formats are unit-tested directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modeld.errors import InvalidRequestError

TEMPLATE = "template"  # the GGUF's tokenizer.chat_template, rendered with Jinja
GEMMA = "gemma"
CHATML = "chatml"
LLAMA3 = "llama-3"
PLAIN = "plain"
QA = "qa"  # "Question: …\nAnswer:" completion, for base (not instruction-tuned) models
KNOWN_FORMATS = (TEMPLATE, GEMMA, CHATML, LLAMA3, PLAIN, QA)

#: ``general.finetune`` / ``general.name`` words that mark an instruction-tuned model.
_INSTRUCT_WORDS = ("it", "instruct", "chat", "sft", "dpo", "rlhf")

#: ``render(template, messages, bos_token, eos_token, **template variables) -> prompt text``
Renderer = Callable[..., str]

#: Architectures whose chat format is known when the file carries no template.
_ARCH_FORMATS = {
    "gemma": GEMMA,
    "gemma2": GEMMA,
    "gemma3": GEMMA,
    "gemma3n": GEMMA,
    "qwen2": CHATML,
    "qwen2moe": CHATML,
    "qwen3": CHATML,
    "qwen3moe": CHATML,
}


@dataclass(frozen=True)
class ChatPrompt:
    """A formatted prompt and how to tokenize it.

    ``add_bos``: let the tokenizer add BOS (False when the text already starts with it).
    ``stop``: stop strings of the format (end-of-turn markers); end-of-generation tokens are
    also honoured by the runner, since special tokens do not appear in detokenized text.
    """

    text: str
    stop: tuple[str, ...]
    add_bos: bool
    format: str


def is_instruction_tuned(metadata: Mapping[str, object]) -> bool:
    """Whether GGUF metadata says the model was tuned to follow turns (``general.finetune``
    or a name like ``…-it``/``…-Instruct``). Base models have neither."""
    import re

    text = f"{metadata.get('general.finetune', '')} {metadata.get('general.name', '')}".lower()
    words = set(re.split(r"[^a-z0-9]+", text))
    return any(word in words for word in _INSTRUCT_WORDS)


def choose_format(
    architecture: str,
    has_template: bool,
    override: str | None = None,
    *,
    instruction_tuned: bool = True,
) -> str:
    """The chat format to use for a model (see the module docstring for the order).

    A base model of an architecture with a known turn format (the default gemma-3-270m is one)
    never saw those turn markers in training and answers them with noise, so it gets the
    ``qa`` completion format instead.
    """
    if override is not None:
        if override not in KNOWN_FORMATS:
            raise InvalidRequestError(
                f"unknown chat format {override!r}",
                hint=f"use one of: {', '.join(KNOWN_FORMATS)}",
            )
        if override == TEMPLATE and not has_template:
            raise InvalidRequestError(
                "chat format 'template' was asked for but the model has no chat template",
                hint=f"use one of: {', '.join(f for f in KNOWN_FORMATS if f != TEMPLATE)}",
            )
        return override
    if has_template:
        return TEMPLATE
    known = _ARCH_FORMATS.get(architecture.lower())
    if known is None:
        return PLAIN
    return known if instruction_tuned else QA


def format_messages(
    messages: Sequence[Mapping[str, str]],
    fmt: str,
    *,
    template: str | None = None,
    bos_token: str = "",
    eos_token: str = "",
    render: Renderer | None = None,
    template_vars: Mapping[str, Any] | None = None,
) -> ChatPrompt:
    """Format ``messages`` (dicts with role and content) as a prompt ending at the reply.

    ``render`` is required for the ``template`` format (see :data:`Renderer`); it gets the
    messages as they are (with tool calls, tool results) and ``template_vars`` (``tools``,
    ``enable_thinking``). The other formats see only each message's role and content.
    """
    if not messages:
        raise InvalidRequestError("a chat needs at least one message")
    if fmt == TEMPLATE:
        if not template or render is None:
            raise InvalidRequestError("the model has no chat template to render")
        text = render(template, messages, bos_token, eos_token, **(template_vars or {}))
        starts_with_bos = bool(bos_token) and text.startswith(bos_token)
        return ChatPrompt(text, (eos_token,) if eos_token else (), not starts_with_bos, TEMPLATE)
    msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    if fmt == GEMMA:
        return ChatPrompt(_gemma(msgs), ("<end_of_turn>",), True, GEMMA)
    if fmt == CHATML:
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
        return ChatPrompt(body + "<|im_start|>assistant\n", ("<|im_end|>",), True, CHATML)
    if fmt == LLAMA3:
        body = "".join(
            f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
            for m in msgs
        )
        tail = "<|start_header_id|>assistant<|end_header_id|>\n\n"
        return ChatPrompt(body + tail, ("<|eot_id|>",), True, LLAMA3)
    if fmt == PLAIN:
        return _plain(msgs)
    if fmt == QA:
        return _qa(msgs)
    raise InvalidRequestError(
        f"unknown chat format {fmt!r}", hint=f"use one of: {', '.join(KNOWN_FORMATS)}"
    )


def _gemma(msgs: list[dict[str, str]]) -> str:
    """Gemma's turn format; Gemma has no system role, so the system text opens the first user turn
    (exactly what Gemma 3's own template does)."""
    system = "\n\n".join(m["content"] for m in msgs if m["role"] == "system")
    turns = [m for m in msgs if m["role"] != "system"]
    out: list[str] = []
    pending_system = system
    for m in turns:
        role = "model" if m["role"] in ("assistant", "model") else "user"
        content = m["content"]
        if pending_system and role == "user":
            content = f"{pending_system}\n\n{content}"
            pending_system = ""
        out.append(f"<start_of_turn>{role}\n{content}<end_of_turn>\n")
    if pending_system:  # only a system message (or it came after every user turn)
        out.insert(0, f"<start_of_turn>user\n{pending_system}<end_of_turn>\n")
    out.append("<start_of_turn>model\n")
    return "".join(out)


def _plain(msgs: list[dict[str, str]]) -> ChatPrompt:
    """For models with no known format: a lone user message is a plain completion of its text;
    a conversation becomes a simple role-prefixed transcript."""
    if len(msgs) == 1 and msgs[0]["role"] == "user":
        return ChatPrompt(msgs[0]["content"], (), True, PLAIN)
    lines = [f"{m['role'].capitalize()}: {m['content']}\n" for m in msgs]
    return ChatPrompt("".join(lines) + "Assistant:", ("\nUser:",), True, PLAIN)


def _qa(msgs: list[dict[str, str]]) -> ChatPrompt:
    """A question/answer transcript that base models continue sensibly; system text leads."""
    system = "\n\n".join(m["content"] for m in msgs if m["role"] == "system")
    out = [f"{system}\n\n"] if system else []
    for m in msgs:
        if m["role"] == "system":
            continue
        label = "Answer" if m["role"] in ("assistant", "model") else "Question"
        out.append(f"{label}: {m['content']}\n")
    out.append("Answer:")
    return ChatPrompt("".join(out), ("\nQuestion:",), True, QA)

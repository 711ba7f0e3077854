"""A generate request's prompt text and how its reply is read back (content, thinking, tool
calls), from the request and what the model's chat template can do.

Tools reach a template that knows tools as the ``tools`` variable (as llama-server and Ollama
pass them) and thinking on/off as ``enable_thinking``; a model whose template knows no tools
(the default model has no template at all) is shown the tools as a system text and answers
in the generic JSON shape. Pure: rendering is the ``render`` callable the runner passes in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from modeld import replyparse
from modeld.errors import InvalidRequestError
from modeld.runner import chat
from modeld.runner.promptplan import Span
from modeld.runner.specs import GenerateSpec
from modeld.wire.messages import ChatMessage, plain_text, template_messages, tools_prompt

#: Where an image goes in the rendered prompt: random per process, so no text a user sends
#: can pass for one (the runner splits the prompt here and asks libmtmd for the image's tokens).
IMAGE_MARKER = f"<__modeld_image_{secrets.token_hex(8)}__>"


@dataclass(frozen=True)
class Media:
    """A tokenized prompt's images: their positions (``spans``) and the runner's handle of
    each (:class:`modeld.runner.vision.Image`), in order."""

    spans: tuple[Span, ...]
    images: tuple[Any, ...]

    def free(self) -> None:
        """Free every image's chunk not freed yet (a prompt that will not run: each holds a
        preprocessed image, megabytes for a large projector)."""
        for image in self.images:
            image.free()


@dataclass(frozen=True)
class PromptText:
    """The prompt and the reading of its reply: ``family`` of tool-call syntax, ``thinking``
    split on, ``thinking_open`` (the prompt itself opened the thinking block)."""

    text: str
    add_bos: bool
    stops: tuple[str, ...]
    family: str = "generic"
    tools: bool = False
    thinking: bool = False
    thinking_open: bool = False
    media: Media | None = None  # set once tokenized, when the prompt has images

    @property
    def markers(self) -> tuple[str, ...]:
        """Marker texts the reply's special tokens must be detokenized as (a family's
        ``[TOOL_CALLS]`` or ``<think>`` is often a control token, which is otherwise
        rendered as nothing)."""
        if not (self.tools or self.thinking):
            return ()
        return replyparse.preserved_markers(self.family, thinking=self.thinking)

    def parser(self, forced: bool) -> replyparse.ReplyParser | None:
        """A reader of the reply, when it has anything but text to find."""
        if not (self.tools or self.thinking or forced):
            return None
        # a forced call is written in the family's syntax (modeld.daemon.grammar), generic's is JSON
        return replyparse.ReplyParser(self.family, tools=self.tools, thinking=self.thinking,
                                      thinking_open=self.thinking_open,
                                      forced=forced and self.family == "generic")  # fmt: skip


@dataclass(frozen=True)
class ModelChat:
    """What the loaded model's chat side is: its format, template and special texts."""

    fmt: str
    template: str | None
    bos: str
    eos: str

    @property
    def capabilities(self) -> frozenset[str]:
        return replyparse.template_capabilities(self.template) if self.template else frozenset()


def build(spec: GenerateSpec, model: ModelChat, render: chat.Renderer) -> PromptText:
    """The prompt for ``spec`` (raw, one user turn, or its messages) on ``model``; each image
    is :data:`IMAGE_MARKER` in its text (before a prompt's text, at its offset in a message)."""
    if spec.raw and spec.prompt is not None:
        if spec.tools or spec.think:
            raise InvalidRequestError("a raw prompt cannot carry 'tools' or 'think'",
                                      hint="send messages, or leave them out")
        return PromptText(IMAGE_MARKER * len(spec.images) + spec.prompt, True, ())
    caps = model.capabilities
    markers = replyparse.thinking_markers(model.template)
    if spec.think and markers is None:
        raise InvalidRequestError("this model does not think ('think' was true)",
                                  hint="leave 'think' out for this model")
    messages = spec.messages or (ChatMessage("user", spec.prompt or "", images=spec.images),)
    if any(m.images for m in messages):
        messages = tuple(dataclasses.replace(m, content=m.with_markers(IMAGE_MARKER))
                         if m.images else m for m in messages)  # fmt: skip
    tools = spec.tools
    native_tools = bool(tools) and model.fmt == chat.TEMPLATE and "tools" in caps
    if tools and not native_tools:  # show them as text; the reply is generic JSON
        messages = (ChatMessage("system", tools_prompt(tools)), *messages)
    family = replyparse.native_family(model.template) if native_tools else "generic"
    if model.fmt == chat.TEMPLATE:
        history = template_messages(messages)
        if family == "mistral":
            _mistral_ids(history)
        variables: dict[str, Any] = {}
        if native_tools:
            variables["tools"] = [t.openai() for t in tools]
        if spec.think is not None and markers is not None:
            variables["enable_thinking"] = spec.think
        cp = chat.format_messages(history, chat.TEMPLATE,
                                  template=model.template, bos_token=model.bos,
                                  eos_token=model.eos, render=render,
                                  template_vars=variables)  # fmt: skip
    else:
        plain = [{"role": "user" if m.role == "tool" else m.role, "content": plain_text(m)}
                 for m in messages]  # fmt: skip
        cp = chat.format_messages(plain, model.fmt)
    thinking = markers is not None and spec.think is not False
    opened = thinking and replyparse.prompt_opens_thinking(cp.text)
    return PromptText(cp.text, cp.add_bos, cp.stop, family, bool(tools), thinking, opened)


def turn_marker(model: ModelChat, render: chat.Renderer,
                tokenize: Callable[[str], list[int]]) -> tuple[int, ...]:
    """The tokens between a user's message and the reply in ``model``'s format (ChatML's
    ``<|im_end|>\n<|im_start|>assistant\n``), as they are tokenized after a message: a
    reproducible prompt's pieces end after them (:func:`modeld.runner.promptplan.turn_marks`).
    () when a template cannot render the probe or the text does not split there."""
    probe = "modeld probe"
    try:
        text = chat.format_messages([{"role": "user", "content": probe}], model.fmt,
                                    template=model.template, bos_token=model.bos,
                                    eos_token=model.eos, render=render).text  # fmt: skip
    except Exception:  # a template that raises on one plain user turn: no marks, no harm
        return ()
    at = text.rfind(probe) + len(probe)
    head, whole = tokenize(text[:at]), tokenize(text)
    return tuple(whole[len(head):]) if at >= len(probe) and whole[:len(head)] == head else ()


def _mistral_ids(history: list[dict[str, Any]]) -> None:
    """Mistral's templates raise on a call id that is not 9 characters (modeld's and OpenAI's
    are longer): the same id gets the same 9-character stand-in in the call and its result."""
    def short(call_id: str) -> str:
        return call_id if len(call_id) == 9 and call_id.isalnum() else \
            hashlib.sha1(call_id.encode()).hexdigest()[:9]  # fmt: skip

    for m in history:
        for call in m.get("tool_calls", ()):
            call["id"] = short(call["id"])
        if "tool_call_id" in m:
            m["tool_call_id"] = short(m["tool_call_id"])


def image_data(spec: GenerateSpec) -> tuple[bytes, ...]:
    """The request's image files in the order their markers come in the prompt."""
    if spec.messages is None:
        return spec.images
    return tuple(image for m in spec.messages for image in m.images)

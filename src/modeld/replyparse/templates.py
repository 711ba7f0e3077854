"""What a GGUF chat template says about a model: its tool-call syntax and its capabilities.

Why from the template: it is the one place a GGUF records how the model was trained to call tools
and think (Ollama and llama-server decide the same way), and it is known before the first reply.
"""

from __future__ import annotations

FAMILIES = ("hermes", "llama3", "mistral", "generic")

#: Template markers of each family, checked in this order.
_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("hermes", ("<tool_call>",)),
    ("mistral", ("[TOOL_CALLS]",)),
    ("llama3", ("<|python_tag|>", "ipython")),
)

#: Architectures whose instruct models call tools the Hermes way even when the template
#: does not say so (Qwen 2.5 and later).
_ARCH_FAMILIES = {"qwen2": "hermes", "qwen2moe": "hermes", "qwen3": "hermes", "qwen3moe": "hermes"}


def tool_family(template: str | None, architecture: str) -> str:
    """The family of the model's tool-call syntax (one of ``FAMILIES``): from markers in the
    chat template; from the architecture only when the file has no template (a template with
    none of the markers, like DeepSeek-R1's on a qwen2 architecture, is ``generic``)."""
    if template:
        for family, markers in _MARKERS:
            if any(marker in template for marker in markers):
                return family
        return "generic"
    return _ARCH_FAMILIES.get(architecture, "generic")


def native_family(template: str | None) -> str:
    """The syntax a model writes tool calls in when tools reach its template: its family
    when the template knows tools, else ``generic`` (tools shown as text, JSON replies)."""
    if template and "tools" in template_capabilities(template):
        return tool_family(template, "")
    return "generic"


def template_capabilities(template: str | None) -> frozenset[str]:
    """Subset of {"tools", "thinking"}, as Ollama decides it: "tools" when the template
    mentions tools; "thinking" when it has think tags or an ``enable_thinking`` switch."""
    if not template:
        return frozenset()
    caps: set[str] = set()
    if "tools" in template:
        caps.add("tools")
    if thinking_markers(template) is not None:
        caps.add("thinking")
    return frozenset(caps)


def thinking_markers(template: str | None) -> tuple[str, str] | None:
    """``("<think>", "</think>")`` when the model thinks in such a block (the template has both
    tags, as Qwen3's and DeepSeek-R1's do, or an ``enable_thinking`` switch), else None."""
    if not template:
        return None
    if ("<think>" in template and "</think>" in template) or "enable_thinking" in template:
        return ("<think>", "</think>")
    return None


#: The marker strings each family's parser must see in the generated text.
_FAMILY_MARKERS = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "llama3": ("<|python_tag|>",),
    "mistral": ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    "generic": (),
}


def preserved_markers(family: str, *, thinking: bool) -> tuple[str, ...]:
    """Markers the runner must keep in the detokenized text: where one is a single special
    (control) token, render that token with ``special=True``, as llama-server does for its
    ``preserved_tokens``; other special tokens (end of turn) stay hidden."""
    think = ("<think>", "</think>") if thinking else ()
    return _FAMILY_MARKERS[family] + think


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether a rendered prompt ends inside an opened ``<think>`` block (DeepSeek-R1 distills,
    QwQ), so that the reply starts with thinking: pass the result as ``thinking_open``."""
    tail = prompt.rstrip()
    return tail.endswith("<think>")

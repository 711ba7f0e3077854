"""Reply parsing: a model's generated text (streamed) into content, thinking and tool calls.

Pure (no native imports). The runner feeds each decoded piece to a ``ReplyParser`` and forwards
the events; ``parse_reply`` does a whole reply at once. The family of a model's tool-call syntax
and its capabilities come from its GGUF chat template (``tool_family``,
``template_capabilities``, ``thinking_markers``).

Wiring notes: the generated text must keep the markers, and llama-cpp-python's ``detokenize``
drops CONTROL-typed tokens unless ``special=True`` (a vocabulary may type ``[TOOL_CALLS]``,
``[ARGS]`` or ``<|python_tag|>`` so), so render the ``preserved_markers`` tokens; pass
``thinking_open=prompt_opens_thinking(prompt)``; pass ``forced=True`` when a grammar made the
reply a generic call object (tool_choice "required" or a named function).
"""

from __future__ import annotations

from modeld.replyparse.events import (
    Event,
    ParsedCall,
    TextDelta,
    ThinkingDelta,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    new_call_id,
)
from modeld.replyparse.parser import ReplyParser, fold, parse_reply
from modeld.replyparse.templates import (
    FAMILIES,
    native_family,
    preserved_markers,
    prompt_opens_thinking,
    template_capabilities,
    thinking_markers,
    tool_family,
)

__all__ = [
    "FAMILIES",
    "Event",
    "ParsedCall",
    "ReplyParser",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallArgs",
    "ToolCallEnd",
    "ToolCallStart",
    "fold",
    "native_family",
    "new_call_id",
    "parse_reply",
    "preserved_markers",
    "prompt_opens_thinking",
    "template_capabilities",
    "thinking_markers",
    "tool_family",
]

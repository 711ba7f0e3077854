"""Real chat templates (tests/templates/): the family and capabilities ``replyparse`` derives from
each, what each needs to render tools, calls and tool results (with llama-cpp-python's own Jinja
formatter, as the runner renders them), and that the call a template writes parses back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modeld.replyparse import (
    FAMILIES,
    parse_reply,
    preserved_markers,
    prompt_opens_thinking,
    template_capabilities,
    thinking_markers,
    tool_family,
)

llama_chat_format = pytest.importorskip("llama_cpp.llama_chat_format")

DIR = Path(__file__).parent / "templates"
QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
QWEN3 = "Qwen-Qwen3-0.6B.jinja"
HERMES2 = "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"
LLAMA31 = "meta-llama-Llama-3.1-8B-Instruct.jinja"
LLAMA32 = "meta-llama-Llama-3.2-3B-Instruct.jinja"
NEMO = "mistralai-Mistral-Nemo-Instruct-2407.jinja"
SMALL32 = "Mistral-Small-3.2-24B-Instruct-2506.jinja"
R1 = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"

#: file: (architecture, family, capabilities, bos, eos)
TEMPLATES: dict[str, tuple[str, str, set[str], str, str]] = {
    QWEN25: ("qwen2", "hermes", {"tools"}, "", "<|im_end|>"),
    QWEN3: ("qwen3", "hermes", {"tools", "thinking"}, "", "<|im_end|>"),
    HERMES2: ("llama", "hermes", {"tools"}, "<|begin_of_text|>", "<|im_end|>"),
    LLAMA31: ("llama", "llama3", {"tools"}, "<|begin_of_text|>", "<|eot_id|>"),
    LLAMA32: ("llama", "llama3", {"tools"}, "<|begin_of_text|>", "<|eot_id|>"),
    NEMO: ("llama", "mistral", {"tools"}, "<s>", "</s>"),
    SMALL32: ("llama", "mistral", {"tools"}, "<s>", "</s>"),
    R1: ("qwen2", "generic", {"thinking"}, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string"}},
                "required": ["location"],
            },
        },
    }
]
CALL_ID = "abcdefghi"  # the Mistral templates want 9 alphanumeric characters


def template(name: str) -> str:
    return (DIR / name).read_text()


def render(name: str, messages: list[dict[str, Any]], *, generation: bool = True) -> str:
    _, _, _, bos, eos = TEMPLATES[name]
    formatter = llama_chat_format.Jinja2ChatFormatter(
        template=template(name), eos_token=eos, bos_token=bos, add_generation_prompt=generation
    )
    prompt: str = formatter(messages=messages, tools=TOOLS).prompt
    return prompt


def conversation(
    *, content: str | None = "", arguments: Any = None, call_id: str = CALL_ID
) -> list[dict[str, Any]]:
    """User asks, the assistant calls get_weather, the tool answers."""
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments or {"location": "Paris"}},
    }
    return [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": content, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "name": "get_weather", "content": '{"temp": 21}'},
    ]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_family_and_capabilities(name: str) -> None:
    arch, family, caps, _, _ = TEMPLATES[name]
    text = template(name)
    assert tool_family(text, arch) == family
    assert template_capabilities(text) == frozenset(caps)
    expected_markers = ("<think>", "</think>") if "thinking" in caps else None
    assert thinking_markers(text) == expected_markers


def test_no_template_falls_back_on_the_architecture() -> None:
    assert tool_family(None, "qwen2") == "hermes"
    assert tool_family(None, "llama") == "generic"
    assert tool_family("", "gemma3") == "generic"
    assert template_capabilities(None) == frozenset()
    assert thinking_markers(None) is None


def test_capabilities_from_template_words() -> None:
    assert template_capabilities("{% if tools %}{% endif %}") == frozenset({"tools"})
    assert template_capabilities("<think> only the opening tag") == frozenset()
    assert template_capabilities("{% if enable_thinking %}{% endif %}") == {"thinking"}
    assert thinking_markers("{{ '<think>' }}{{ '</think>' }}") == ("<think>", "</think>")
    assert tool_family("<|start_header_id|>ipython<|end_header_id|>", "llama") == "llama3"


@pytest.mark.parametrize("name", sorted(set(TEMPLATES) - {R1}))
def test_renders_tools_calls_and_results(name: str) -> None:
    """Arguments as a dict, content "" (not None), a 9-character id: every template renders."""
    prompt = render(name, conversation())
    assert "get_weather" in prompt and '{"temp": 21}' in prompt.replace('\\"', '"')


@pytest.mark.parametrize("name", sorted(set(TEMPLATES) - {R1}))
def test_the_call_a_template_writes_parses_back(name: str) -> None:
    """What the template writes for an assistant call is the form the model learned; the parser
    must read it back as the same call (ids aside)."""
    _, family, caps, _, eos = TEMPLATES[name]
    arguments = {"location": "Paris", "days": [1, 2], "note": 'say "hi" {x}'}
    messages = conversation(arguments=arguments)[1:3]  # Nemo moves the system text: leave it out
    before = render(name, messages[:1], generation=True)
    full = render(name, messages, generation=False)
    assert full.startswith(before)
    reply = full[len(before) :].split(eos)[0]
    content, thought, calls = parse_reply(family, reply, tools=True, thinking="thinking" in caps)
    assert (content, thought) == ("", "")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", arguments)]


def test_template_needs() -> None:
    """What the lead's message conversion must respect (each raises or misrenders otherwise)."""
    # Mistral Nemo and Small 3.2: call ids and tool_call_id of exactly 9 characters.
    for name in (NEMO, SMALL32):
        with pytest.raises(ValueError, match="length 9"):
            render(name, conversation(call_id="call_0123456789abcdef01234567"))
    # Qwen3: assistant content must be a string (it looks for '</think>' in it).
    with pytest.raises(TypeError):
        render(QWEN3, conversation(content=None))
    # Llama 3.1/3.2: one call per assistant message.
    for name in (LLAMA31, LLAMA32):
        two = conversation()
        calls = two[2]["tool_calls"]
        calls.append({**calls[0], "id": "bcdefghij"})
        with pytest.raises(ValueError, match="single tool-calls"):
            render(name, two)
    # Arguments as a JSON string are written as a quoted string by Qwen2.5, Llama 3.x and the
    # Mistral templates: pass a dict.
    as_text = json.dumps({"location": "Paris"})
    for name in (QWEN25, LLAMA31, LLAMA32, NEMO, SMALL32):
        assert '"{\\"location\\": \\"Paris\\"}"' in render(name, conversation(arguments=as_text))
    # DeepSeek-R1 distills: a call is rendered only with content None and string arguments.
    assert "get_weather" not in render(R1, conversation(arguments=as_text))
    with pytest.raises(TypeError):
        render(R1, conversation(content=None))
    assert "get_weather\n```json\n" in render(R1, conversation(content=None, arguments=as_text))


def test_prompt_opens_thinking() -> None:
    user = [{"role": "user", "content": "2+2?"}]
    assert prompt_opens_thinking(render(R1, user))
    assert not prompt_opens_thinking(render(QWEN3, user))
    formatter = llama_chat_format.Jinja2ChatFormatter(
        template=template(QWEN3), eos_token="<|im_end|>", bos_token=""
    )
    no_think = formatter(messages=user, enable_thinking=False).prompt
    assert no_think.endswith("<think>\n\n</think>\n\n")
    assert not prompt_opens_thinking(no_think)


def test_preserved_markers() -> None:
    assert preserved_markers("hermes", thinking=True) == (
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
    )
    assert preserved_markers("mistral", thinking=False) == ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
    assert preserved_markers("llama3", thinking=False) == ("<|python_tag|>",)
    assert all(isinstance(preserved_markers(f, thinking=False), tuple) for f in FAMILIES)

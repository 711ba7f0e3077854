"""Recorded replies of real models, one per tool-call family and form, with what they parse to.

Sources (exact strings, quoted from the files named):
- llama.cpp ``tests/test-chat.cpp`` (github ggml-org/llama.cpp, commit 1eeb523c, 2025-09-21):
  its expected model outputs for Hermes 2 Pro / Qwen 2.5 / QwQ, Llama 3.1/3.2, Mistral Nemo,
  DeepSeek-R1 distills and the generic format.
- Ollama ``model/parsers/ministral_test.go`` (github ollama/ollama, commit 3181dcbb): Mistral
  Small 3.2 / Ministral ``[TOOL_CALLS]name[ARGS]{…}`` outputs.
- The chat templates in ``tests/templates/`` (see its README): how each template writes an
  assistant turn with tool calls, which is the form the model was trained to produce (Qwen3's
  ``<think>`` block then ``<tool_call>``; Mistral Small 3.2's ``[CALL_ID]``; Llama 3.2's
  ``{"name": …, "parameters": …}``). Marked "template" below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Case:
    id: str
    family: str
    text: str
    content: str
    thinking: str = ""
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    opts: dict[str, bool] = field(default_factory=lambda: {"tools": True, "thinking": False})


T = {"tools": True, "thinking": False}
TT = {"tools": True, "thinking": True}
TTO = {"tools": True, "thinking": True, "thinking_open": True}
NO_TOOLS = {"tools": False, "thinking": False}
SF = ("special_function", {"arg1": 1})
HELLO = "Hello, world!\nWhat's up?"

CASES: list[Case] = [
    # ---- hermes: Qwen 2.5 / Qwen3 / Hermes 2 Pro / QwQ (test-chat.cpp, HERMES_2_PRO) ----
    Case(
        "hermes-qwen25-call",
        "hermes",
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        "",
        calls=(SF,),
    ),
    Case(
        "hermes-no-newlines",
        "hermes",
        '<tool_call>{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>',
        "",
        calls=(SF,),
    ),
    Case(
        "hermes-content-before-call",
        "hermes",
        "Hello, world!\nWhat's up?<tool_call>\n"
        '{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        HELLO,
        calls=(SF,),
    ),
    Case(
        "hermes-two-calls",
        "hermes",
        "<tool_call>\n"
        '{"name": "special_function", "arguments": {"arg1": 1}}\n'
        "</tool_call>\n"
        "<tool_call>\n"
        '{"name": "python", "arguments": {"code":"print(\'hello\')"}}\n'
        "</tool_call>",
        "",
        calls=(SF, ("python", {"code": "print('hello')"})),
    ),
    Case(
        "hermes-python-lines",
        "hermes",
        "<tool_call>\n"
        '{"name": "python", "arguments": {"code":"# This is a program:\\nprint(\'hey\')"}}\n'
        "</tool_call>",
        "",
        calls=(("python", {"code": "# This is a program:\nprint('hey')"}),),
    ),
    Case(
        "hermes-bare-json-call",  # test-chat.cpp: HERMES_2_PRO also takes a bare call object
        "hermes",
        '{\n  "name": "special_function", "arguments": {"arg1": 1}}',
        "",
        calls=(SF,),
    ),
    Case(
        "hermes-leading-newline-before-call",
        "hermes",
        '\n<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>\n',
        "",
        calls=(SF,),
    ),
    Case(
        "hermes-json-after-text-is-text",  # unlike llama-server, only at the start of the reply
        "hermes",
        'This is not a tool call:\n{"name": "special_function", "arguments": {"arg1": 1}}',
        'This is not a tool call:\n{"name": "special_function", "arguments": {"arg1": 1}}',
    ),
    Case(
        "hermes-plain-reply",
        "hermes",
        HELLO,
        HELLO,
    ),
    Case(
        "hermes-think-unparsed",  # thinking off: the tags stay in the content
        "hermes",
        "<think>I'm\nthinking</think>Hello, world!\nWhat's up?",
        "<think>I'm\nthinking</think>Hello, world!\nWhat's up?",
    ),
    Case(
        "hermes-think-parsed",
        "hermes",
        "<think>I'm\nthinking</think>Hello, world!\nWhat's up?",
        HELLO,
        thinking="I'm\nthinking",
        opts=TT,
    ),
    Case(
        "qwq-thinking-forced-open-call",  # QwQ-32B's template ends the prompt with <think>
        "hermes",
        "I'm\nthinking</think>\n"
        '<tool_call>{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>',
        "",
        thinking="I'm\nthinking",
        calls=(SF,),
        opts=TTO,
    ),
    Case(
        "hermes-unclosed-think-is-all-thinking",
        "hermes",
        "<think><tool_call>nah uhg</tool_call>",
        "",
        thinking="<tool_call>nah uhg</tool_call>",
        opts=TT,
    ),
    Case(
        "qwen3-think-then-call",  # template: Qwen-Qwen3-0.6B.jinja's assistant turn
        "hermes",
        "<think>\nThe user wants the weather in Paris, so I call get_weather.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris", "unit": "c"}}\n'
        "</tool_call>",
        "",
        thinking="The user wants the weather in Paris, so I call get_weather.",
        calls=(("get_weather", {"location": "Paris", "unit": "c"}),),
        opts=TT,
    ),
    Case(
        "qwen3-think-text-then-two-calls",  # template: Qwen3 writes "\n" between content and calls
        "hermes",
        "<think>\nTwo cities.\n</think>\n\nLet me check both.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Lyon"}}\n</tool_call>',
        "Let me check both.",
        thinking="Two cities.",
        calls=(("get_weather", {"location": "Paris"}), ("get_weather", {"location": "Lyon"})),
        opts=TT,
    ),
    Case(
        "qwen3-thinking-disabled-empty-block",  # enable_thinking=false: the prompt holds the block
        "hermes",
        "The capital of France is Paris.",
        "The capital of France is Paris.",
        opts=TT,
    ),
    Case(
        "hermes2pro-unicode-args",  # template: NousResearch-Hermes-2-Pro's <tool_call> form
        "hermes",
        '<tool_call>\n{"arguments": {"city": "Zürich", "note": "naïve \\"quoted\\" {x}"}, '
        '"name": "get_weather"}\n</tool_call>',
        "",
        calls=(("get_weather", {"city": "Zürich", "note": 'naïve "quoted" {x}'}),),
    ),
    # ---- llama3: Llama 3.1 / 3.2 / 3.3 (test-chat.cpp, LLAMA_3_X) ----
    Case(
        "llama3-parameters",
        "llama3",
        '{"name": "special_function", "parameters": {"arg1": 1}}',
        "",
        calls=(SF,),
    ),
    Case(
        "llama32-type-function",  # Llama 3.2 often adds "type"; llama.cpp's regex allows it
        "llama3",
        '{"type": "function", "name": "get_weather", "parameters": {"location": "Paris"}}',
        "",
        calls=(("get_weather", {"location": "Paris"}),),
    ),
    Case(
        "llama31-python-tag-json",
        "llama3",
        '<|python_tag|>{"name": "get_weather", "parameters": {"location": "Paris"}}',
        "",
        calls=(("get_weather", {"location": "Paris"}),),
    ),
    Case(
        "llama3-two-calls-semicolon",
        "llama3",
        '{"name": "get_weather", "parameters": {"location": "Paris"}}; '
        '{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}',
        "",
        calls=(("get_weather", {"location": "Paris"}), ("get_time", {"tz": "Europe/Paris"})),
    ),
    Case(
        "llama3-two-calls-newline",
        "llama3",
        '{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {"x": [1, {"y": null}]}}',
        "",
        calls=(("a", {}), ("b", {"x": [1, {"y": None}]})),
    ),
    Case(
        "llama3-builtin-python-call-is-text",  # test-chat.cpp: code_interpreter builtin (not JSON)
        "llama3",
        "<|python_tag|>python.call(code=\"print('hey')\")",
        "<|python_tag|>python.call(code=\"print('hey')\")",
    ),
    Case("llama3-plain-reply", "llama3", HELLO, HELLO),
    Case(
        "llama3-prose-with-json-is-text",
        "llama3",
        'To call it, write {"name": "get_weather", "parameters": {}} on one line.',
        'To call it, write {"name": "get_weather", "parameters": {}} on one line.',
    ),
    Case(
        "llama3-json-answer-is-text",  # a JSON object that is not a call
        "llama3",
        '{"answer": 42, "name": "x"}',
        '{"answer": 42, "name": "x"}',
    ),
    # ---- mistral ----
    Case(
        "mistral-nemo-array",  # test-chat.cpp, MISTRAL_NEMO
        "mistral",
        '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]',
        "",
        calls=(SF,),
    ),
    Case(
        "mistral-nemo-two-in-array",  # template: mistralai-Mistral-Nemo-Instruct-2407.jinja
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Paris"}, '
        '"id": "abcdefghi"}, {"name": "get_time", "arguments": {}, "id": "bcdefghij"}]',
        "",
        calls=(("get_weather", {"location": "Paris"}), ("get_time", {})),
    ),
    Case(
        "mistral-small32-args",  # ministral_test.go "simple tool call"
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"location": "San Francisco"}',
        "",
        calls=(("get_weather", {"location": "San Francisco"}),),
    ),
    Case(
        "mistral-small32-nested",  # ministral_test.go "tool call with nested object"
        "mistral",
        '[TOOL_CALLS]create_entities[ARGS]{"entities": [{"entityType": "Person", "name": "Jack", '
        '"observations": ["Works as a baker at Big Baker Co."]}]}',
        "",
        calls=(
            (
                "create_entities",
                {
                    "entities": [
                        {
                            "entityType": "Person",
                            "name": "Jack",
                            "observations": ["Works as a baker at Big Baker Co."],
                        }
                    ]
                },
            ),
        ),
    ),
    Case(
        "mistral-small32-escapes",  # ministral_test.go escaped quotes, braces, backslashes
        "mistral",
        '[TOOL_CALLS]search[ARGS]{"query": "say \\"hello\\""}'
        '[TOOL_CALLS]format[ARGS]{"template": "Hello {name}!"}'
        '[TOOL_CALLS]path[ARGS]{"dir": "C:\\\\Users\\\\test"}',
        "",
        calls=(
            ("search", {"query": 'say "hello"'}),
            ("format", {"template": "Hello {name}!"}),
            ("path", {"dir": "C:\\Users\\test"}),
        ),
    ),
    Case(
        "mistral-small32-call-id",  # template: Mistral-Small-3.2-24B-Instruct-2506.jinja
        "mistral",
        '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}',
        "",
        calls=(SF,),
    ),
    Case(
        "mistral-text-before-call",
        "mistral",
        'I will look that up.[TOOL_CALLS]get_weather[ARGS]{"location": "Paris"}',
        "I will look that up.",
        calls=(("get_weather", {"location": "Paris"}),),
    ),
    Case("mistral-plain-reply", "mistral", HELLO, HELLO),
    Case(
        "mistral-brackets-are-text",
        "mistral",
        "Lists look like [1, 2, 3] and [TOOL] tags like [INST] are not calls.",
        "Lists look like [1, 2, 3] and [TOOL] tags like [INST] are not calls.",
    ),
    # ---- generic (test-chat.cpp, GENERIC) ----
    Case(
        "generic-tool-calls-wrapper",
        "generic",
        "{\n"
        '  "tool_calls": [\n'
        "    {\n"
        '      "name": "special_function",\n'
        '      "arguments": {\n'
        '        "arg1": 1\n'
        "      },\n"
        '      "id": "123456789"\n'
        "    }\n"
        "  ]\n"
        "}",
        "",
        calls=(SF,),
    ),
    Case(
        "generic-tool-call-single",
        "generic",
        '{"tool_call": {"name": "puppeteer_screenshot", '
        '"arguments": {"name": "servethehome_homepage"}}}',
        "",
        calls=(("puppeteer_screenshot", {"name": "servethehome_homepage"}),),
    ),
    Case(
        "generic-bare-call",
        "generic",
        '{"name": "special_function", "arguments": {"arg1": 1}}',
        "",
        calls=(SF,),
    ),
    Case(
        "generic-response-is-text",  # llama-server's {"response": …} is not unwrapped here
        "generic",
        '{\n  "response": "Hello, world!\\nWhat\'s up?"\n}',
        '{\n  "response": "Hello, world!\\nWhat\'s up?"\n}',
    ),
    Case("generic-plain-reply", "generic", HELLO, HELLO),
    # ---- DeepSeek-R1 distills: the template opens <think> in the prompt ----
    Case(
        "deepseek-r1-forced-open",  # test-chat.cpp, DEEPSEEK_R1 thinking_forced_open
        "generic",
        "I'm\nthinking</think>Hello, world!\nWhat's up?",
        HELLO,
        thinking="I'm\nthinking",
        opts=TTO,
    ),
    Case(
        "deepseek-r1-distill-typical",  # the distills write "\n</think>\n\n" (template strips it)
        "generic",
        "Okay, so I need to add 2 and 2. That is 4.\n</think>\n\n2 + 2 = **4**.",
        "2 + 2 = **4**.",
        thinking="Okay, so I need to add 2 and 2. That is 4.",
        opts=TTO,
    ),
    Case(
        "deepseek-r1-never-closed",
        "generic",
        "I need to remember the correct syntax. It starts with <｜tool▁calls▁begin｜> "
        "and ends with",
        "",
        thinking="I need to remember the correct syntax. It starts with <｜tool▁calls▁begin｜> "
        "and ends with",
        opts=TTO,
    ),
    # ---- tools off: markers are text ----
    Case(
        "no-tools-hermes-marker-is-text",
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        opts=NO_TOOLS,
    ),
    # ---- malformed calls: their text is content, nothing is lost ----
    Case(
        "bad-json",
        "hermes",
        'Sure. <tool_call>\n{"name": "f", "arguments": {"a": tru}}\n</tool_call> Done.',
        'Sure. <tool_call>\n{"name": "f", "arguments": {"a": tru}}\n</tool_call> Done.',
    ),
    Case(
        "name-not-string",
        "hermes",
        '<tool_call>{"name": 7, "arguments": {}}</tool_call>',
        '<tool_call>{"name": 7, "arguments": {}}</tool_call>',
    ),
    Case(
        "arguments-as-string",
        "hermes",
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
    ),
    Case(
        "no-arguments",
        "llama3",
        '{"name": "get_time"}',
        '{"name": "get_time"}',
    ),
    Case(
        "unterminated-call",
        "hermes",
        'Let me see.\n<tool_call>\n{"name": "f", "arguments": {"a": [1, 2',
        'Let me see.\n<tool_call>\n{"name": "f", "arguments": {"a": [1, 2',
    ),
    Case(
        "bad-then-good",
        "hermes",
        '<tool_call>{"name": "f"}</tool_call>\n'
        '<tool_call>{"name": "g", "arguments": {"k": "v"}}</tool_call>',
        '<tool_call>{"name": "f"}</tool_call>',
        calls=(("g", {"k": "v"}),),
    ),
    Case(
        "mistral-bad-args",  # ministral_test.go "invalid JSON returns error": here, text
        "mistral",
        "[TOOL_CALLS]test[ARGS]{invalid json}",
        "[TOOL_CALLS]test[ARGS]{invalid json}",
    ),
    Case(
        "text-with-markup",
        "hermes",
        'Use <b>bold</b>, <tool> or <tool_cal>, a dict {"a": 1} and a list [1, 2] < 3.',
        'Use <b>bold</b>, <tool> or <tool_cal>, a dict {"a": 1} and a list [1, 2] < 3.',
    ),
    Case(
        "partial-marker-at-end",
        "hermes",
        "The tag starts with <tool_",
        "The tag starts with <tool_",
    ),
]

"""Chat formatting (pure): which format a model gets, and the exact prompt text of each."""

from __future__ import annotations

import pytest

from modeld.errors import InvalidRequestError
from modeld.runner import chat

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BOS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
)
STRICT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}{{ m['content'] }}{% endfor %}"
)


def fake_render(template: str, messages: object, bos: str, eos: str) -> str:
    return f"{bos}<rendered {template}>"


@pytest.mark.parametrize(
    ("arch", "has_template", "override", "expected"),
    [
        ("gemma3", False, None, chat.GEMMA),  # an instruction-tuned gemma without template
        ("gemma2", False, None, chat.GEMMA),
        ("gemma3", True, None, chat.TEMPLATE),  # the file's own template wins
        ("qwen2", False, None, chat.CHATML),
        ("llama", False, None, chat.PLAIN),
        ("some-new-arch", False, None, chat.PLAIN),
        ("llama", True, chat.GEMMA, chat.GEMMA),  # an explicit override wins over everything
        ("llama", True, chat.TEMPLATE, chat.TEMPLATE),
    ],
)
def test_choose_format(arch: str, has_template: bool, override: str | None, expected: str) -> None:
    assert chat.choose_format(arch, has_template, override) == expected


def test_choose_format_rejects_unknown_or_impossible_overrides() -> None:
    with pytest.raises(InvalidRequestError, match="unknown chat format 'llama-2'"):
        chat.choose_format("llama", False, "llama-2")
    with pytest.raises(InvalidRequestError, match="no chat template"):
        chat.choose_format("llama", False, chat.TEMPLATE)


def test_gemma_folds_the_system_prompt_into_the_first_user_turn() -> None:
    p = chat.format_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Capital of France?"},
        ],
        chat.GEMMA,
    )
    assert p.text == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nCapital of France?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert p.stop == ("<end_of_turn>",)
    assert p.add_bos  # the tokenizer adds <bos>; the text does not carry it


def test_gemma_with_only_a_system_message_still_has_a_user_turn() -> None:
    p = chat.format_messages([{"role": "system", "content": "S"}], chat.GEMMA)
    assert p.text == "<start_of_turn>user\nS<end_of_turn>\n<start_of_turn>model\n"


def test_chatml_and_llama3_formats() -> None:
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    p = chat.format_messages(msgs, chat.CHATML)
    assert p.text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    assert p.stop == ("<|im_end|>",)
    p3 = chat.format_messages(msgs, chat.LLAMA3)
    assert p3.text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>" in p3.text
    assert p3.stop == ("<|eot_id|>",)


def test_plain_format_is_a_completion_for_one_message_and_a_transcript_otherwise() -> None:
    one = chat.format_messages([{"role": "user", "content": "Once upon a time"}], chat.PLAIN)
    assert one.text == "Once upon a time" and one.stop == ()
    convo = chat.format_messages(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], chat.PLAIN
    )
    assert convo.text == "System: S\nUser: U\nAssistant:"
    assert convo.stop == ("\nUser:",)


def test_template_format_uses_the_renderer_and_avoids_a_double_bos() -> None:
    msgs = [{"role": "user", "content": "x"}]
    with_bos = chat.format_messages(
        msgs, chat.TEMPLATE, template="T", bos_token="<s>", eos_token="</s>", render=fake_render
    )
    assert with_bos.text == "<s><rendered T>"
    assert not with_bos.add_bos  # the template already wrote <s>
    assert with_bos.stop == ("</s>",)
    no_bos = chat.format_messages(msgs, chat.TEMPLATE, template="T", render=fake_render)
    assert no_bos.add_bos


def test_template_format_needs_a_template_and_a_renderer() -> None:
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(InvalidRequestError):
        chat.format_messages(msgs, chat.TEMPLATE, template=None, render=fake_render)
    with pytest.raises(InvalidRequestError):
        chat.format_messages(msgs, chat.TEMPLATE, template="T", render=None)


def test_empty_conversation_and_unknown_format_are_request_errors() -> None:
    with pytest.raises(InvalidRequestError):
        chat.format_messages([], chat.GEMMA)
    with pytest.raises(InvalidRequestError, match="unknown chat format"):
        chat.format_messages([{"role": "user", "content": "x"}], "vicuna")


# The real renderer lives in the runner (llama-cpp-python's Jinja formatter); importing it only
# loads the library, no model.


def test_real_jinja_rendering_of_gguf_templates() -> None:
    from modeld.runner.template import render_template

    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    p = chat.format_messages(msgs, chat.TEMPLATE, template=CHATML_TEMPLATE, render=render_template)
    assert p.text == chat.format_messages(msgs, chat.CHATML).text
    b = chat.format_messages(
        msgs, chat.TEMPLATE, template=BOS_TEMPLATE, bos_token="<s>", render=render_template
    )
    assert b.text == "<s>[system]S[user]U" and not b.add_bos


def test_template_errors_become_request_errors() -> None:
    from modeld.runner.template import render_template

    with pytest.raises(InvalidRequestError, match="System role not supported"):
        chat.format_messages(
            [{"role": "system", "content": "S"}],
            chat.TEMPLATE,
            template=STRICT_TEMPLATE,
            render=render_template,
        )


@pytest.mark.parametrize(
    ("meta", "tuned"),
    [
        ({"general.name": "Gemma 3 270m"}, False),  # the default model: a base model
        ({"general.name": "Gemma 3 270m", "general.finetune": "it"}, True),
        ({"general.name": "Qwen2.5 0.5B Instruct"}, True),
        ({"general.name": "Llama 3 8B Chat"}, True),
        ({"general.name": "Mistral 7B"}, False),
        ({"general.name": "Editor"}, False),  # "it" must be a whole word
    ],
)
def test_is_instruction_tuned(meta: dict[str, str], tuned: bool) -> None:
    assert chat.is_instruction_tuned(meta) is tuned


def test_base_model_of_a_known_arch_gets_question_answer_format() -> None:
    assert chat.choose_format("gemma3", False, instruction_tuned=False) == chat.QA
    assert chat.choose_format("gemma3", True, instruction_tuned=False) == chat.TEMPLATE
    assert chat.choose_format("llama", False, instruction_tuned=False) == chat.PLAIN
    p = chat.format_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Why is the sky blue?"},
        ],
        chat.QA,
    )
    assert p.text == (
        "Be brief.\n\nQuestion: Hi\nAnswer: Hello\nQuestion: Why is the sky blue?\nAnswer:"
    )
    assert p.stop == ("\nQuestion:",) and p.add_bos and p.format == chat.QA

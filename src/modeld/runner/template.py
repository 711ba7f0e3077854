"""A GGUF chat template rendered with llama-cpp-python's sandboxed Jinja formatter: the
``render`` that :mod:`modeld.runner.prompting` is given (the HF-style environment llama-cpp-python's
own chat handler uses)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from modeld.errors import InvalidRequestError


def render_template(
    template: str, messages: Sequence[Mapping[str, Any]], bos_token: str, eos_token: str,
    **template_vars: Any,
) -> str:
    """Render a GGUF chat template with llama-cpp-python's sandboxed Jinja formatter (the same
    HF-style environment its own chat handler uses); template errors are request errors."""
    formatter = _formatter(template, eos_token, bos_token)
    try:
        chat_messages: Any = [dict(m) for m in messages]
        result = formatter(messages=chat_messages, **template_vars)
    except Exception as exc:  # Jinja errors and the template's own raise_exception()
        raise InvalidRequestError(
            f"the model's chat template could not format these messages: {exc}",
            hint="check the roles and their order, or send a raw prompt",
        ) from exc
    return str(result.prompt)


@functools.lru_cache(maxsize=4)
def _formatter(template: str, eos_token: str, bos_token: str) -> Jinja2ChatFormatter:
    """Compiled once per model, not per request."""
    return Jinja2ChatFormatter(template=template, eos_token=eos_token, bos_token=bos_token)

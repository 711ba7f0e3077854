"""A GGUF chat template rendered in a bounded Jinja sandbox: the ``render`` that
:mod:`modeld.runner.prompting` is given.

The environment is llama-cpp-python's own chat formatter's (HF-style: ``trim_blocks``,
``lstrip_blocks``, ``loopcontrols``, ``{% generation %}`` ignored, Transformers' ``tojson``,
``raise_exception``, ``strftime_now``), built on :class:`~.templatebound.BoundedEnvironment`:
a template that loops or allocates without bound is stopped and the request gets a 400 naming
the template (issue 45); the model serves the next request as before. A template with a syntax
error is a 400 saying so, for every chat request of that model.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from modeld.errors import InvalidRequestError
from modeld.runner import templatebound
from modeld.runner.templatebound import TemplateStopped

_WHAT = "the model's chat template (tokenizer.chat_template in its GGUF)"


def render_template(
    template: str, messages: Sequence[Mapping[str, Any]], bos_token: str, eos_token: str,
    **template_vars: Any,
) -> str:
    """Render a GGUF chat template within its bounds; template errors are request errors."""
    compiled = _compiled(template)
    variables = {"messages": [dict(m) for m in messages], "eos_token": eos_token,
                 "bos_token": bos_token, "raise_exception": _raise_exception,
                 "add_generation_prompt": True, "functions": None, "function_call": None,
                 "tools": None, "tool_choice": None,
                 "strftime_now": Jinja2ChatFormatter.strftime_now, **template_vars}
    try:
        return templatebound.render(compiled, variables)
    except TemplateStopped as exc:
        raise _stopped(exc) from None
    except Exception as exc:  # Jinja errors and the template's own raise_exception()
        raise InvalidRequestError(
            f"the model's chat template could not format these messages: {exc}",
            hint="check the roles and their order, or send a raw prompt",
        ) from exc


def _stopped(exc: TemplateStopped) -> InvalidRequestError:
    return InvalidRequestError(
        f"{_WHAT} was stopped: {exc.why}",
        hint="the template loops or grows without bound: fix the model's chat template "
             "(or load it with another chat_format), or send a raw prompt",
        details={"template": "tokenizer.chat_template"})


def _raise_exception(message: str) -> None:
    raise ValueError(message)


@functools.lru_cache(maxsize=4)
def _compiled(template: str) -> jinja2.Template:
    """Compiled once per model, not per request (a syntax error: every request's 400)."""
    env = templatebound.BoundedEnvironment(
        loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
        extensions=[Jinja2ChatFormatter.IgnoreGenerationTags, jinja2.ext.loopcontrols])
    env.filters["tojson"] = templatebound.bounded_filter(Jinja2ChatFormatter.tojson)
    try:
        return env.from_string(template)  # constants folded here: bounded too
    except TemplateStopped as exc:
        raise _stopped(exc) from None
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidRequestError(
            f"{_WHAT} has a syntax error: {exc.message} (line {exc.lineno})",
            hint="fix the model's chat template (or load it with another chat_format), or "
                 "send a raw prompt", details={"template": "tokenizer.chat_template"}) from None

"""The one declaration of a generate request's sampling options.

Each option is a field of :class:`Sampling` whose metadata says its bounds and the names the
Ollama and OpenAI APIs give it. Everything else derives from this class: the daemon's protocol
parser and the runner's spec (:func:`parse`), the runner message (:meth:`Sampling.to_wire`) and
the HTTP mappings (:func:`api_fields`). Adding an option: a field here, its use in the runner's
sampler (``runner/sampling.make_sampler``), and a CLI flag if it deserves one.

Pure: no native imports, unit-tested on its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from modeld.config import MAX_DRAFT

#: Most tokens one reply may ask for. "Until the end of the text or of the context" (Ollama's
#: ``num_predict: -1``, an omitted OpenAI ``max_tokens``) is this value: the context ends first.
MAX_TOKENS = 1 << 24
#: Most alternatives per token that ``top_logprobs`` may ask for (OpenAI's limit).
MAX_TOP_LOGPROBS = 20


def _opt(
    default: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    ollama: str | None = None,
    openai: tuple[str, ...] = (),
    doc: str,
) -> Any:
    meta = {"lo": lo, "hi": hi, "ollama": ollama, "openai": openai, "doc": doc}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Sampling:
    """How a reply's tokens are chosen. Defaults are modeld's (a request may omit any)."""

    max_tokens: int = _opt(256, 1, MAX_TOKENS, ollama="num_predict",
                           openai=("max_tokens", "max_completion_tokens"),
                           doc="most tokens to generate")  # fmt: skip
    temperature: float = _opt(0.8, 0.0, 100.0, ollama="temperature", openai=("temperature",),
                              doc="0 is greedy (reproducible)")  # fmt: skip
    top_p: float = _opt(0.95, 0.0, 1.0, ollama="top_p", openai=("top_p",), doc="nucleus sampling")
    top_k: int = _opt(40, 0, 1 << 20, ollama="top_k", openai=("top_k",), doc="0: all tokens")
    min_p: float = _opt(0.0, 0.0, 1.0, ollama="min_p", openai=("min_p",),
                        doc="drop tokens below this share of the most likely one's probability")
    repeat_penalty: float = _opt(1.0, 0.0, 10.0, ollama="repeat_penalty",
                                 openai=("repeat_penalty",),
                                 doc="divide the logits of recent tokens (1: off)")  # fmt: skip
    repeat_last_n: int = _opt(64, -1, 1 << 20, ollama="repeat_last_n", openai=("repeat_last_n",),
                              doc="recent tokens the penalties look at (-1: the context)")
    frequency_penalty: float = _opt(0.0, -2.0, 2.0, ollama="frequency_penalty",
                                    openai=("frequency_penalty",),
                                    doc="subtract per occurrence of a recent token")
    presence_penalty: float = _opt(0.0, -2.0, 2.0, ollama="presence_penalty",
                                   openai=("presence_penalty",),
                                   doc="subtract once for a token seen recently")
    seed: int = _opt(0, -(1 << 31), (1 << 32) - 1, ollama="seed", openai=("seed",),
                     doc="random seed (-1: a random one)")
    stop: tuple[str, ...] = _opt((), ollama="stop", openai=("stop",),
                                 doc="strings that end the reply (not included)")
    logprobs: bool = _opt(False, doc="return each token's log-probability")
    top_logprobs: int = _opt(0, 0, MAX_TOP_LOGPROBS,
                             doc="also the most likely alternatives of each token")  # fmt: skip
    draft_max: int = _opt(-1, -1, MAX_DRAFT, ollama="draft_max",
                          openai=("draft_max", "speculative.n_max"),
                          doc="most tokens drafted from the context and checked per step "
                          "(prompt lookup; the text is the same): 0 off, -1 the daemon's "
                          "draft_max setting")  # fmt: skip

    def to_wire(self) -> dict[str, Any]:
        """The JSON form (what :func:`parse` reads back)."""
        out = dataclasses.asdict(self)
        out["stop"] = list(self.stop)
        return out

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


FIELDS: tuple[dataclasses.Field[Any], ...] = dataclasses.fields(Sampling)
NAMES: frozenset[str] = frozenset(f.name for f in FIELDS)
DEFAULTS = Sampling()


def parse(src: Mapping[str, Any], fail: Callable[[str], Exception],
          base: Sampling = DEFAULTS) -> Sampling:
    """The options named in ``src`` (others keep ``base``), each checked against its bounds;
    ``fail(text)`` makes the error to raise (the text names the field)."""
    values: dict[str, Any] = {}
    for f in FIELDS:
        if f.name not in src or src[f.name] is None:
            continue
        values[f.name] = _check(f, src[f.name], fail)
    if values.get("top_logprobs") and not values.get("logprobs", base.logprobs):
        raise fail("'top_logprobs' needs 'logprobs': true")
    return dataclasses.replace(base, **values)


def _check(f: dataclasses.Field[Any], value: Any, fail: Callable[[str], Exception]) -> Any:
    lo, hi = f.metadata["lo"], f.metadata["hi"]
    kind = type(DEFAULTS.__getattribute__(f.name))
    if kind is tuple:  # stop strings
        if isinstance(value, str):
            value = [value]
        if not (isinstance(value, list) and all(isinstance(s, str) and s for s in value)):
            raise fail(f"{f.name!r} must be a string or a list of non-empty strings")
        return tuple(value)
    if kind is bool:
        if not isinstance(value, bool):
            raise fail(f"{f.name!r} must be true or false")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise fail(f"{f.name!r} must be an integer in [{lo}, {hi}]")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise fail(f"{f.name!r} must be a number")
    if not (math.isfinite(value) and lo <= value <= hi):
        raise fail(f"{f.name!r} must be in [{lo}, {hi}]")
    return float(value)


def api_fields(api: str) -> dict[str, str]:
    """API field name -> option name, for ``api`` "ollama" (inside ``options``) or "openai"
    (top level)."""
    out: dict[str, str] = {}
    for f in FIELDS:
        names = f.metadata[api]
        for name in (names,) if isinstance(names, str) else names or ():
            out[name] = f.name
    return out

"""How a token is chosen from a logits row: llama.cpp's sampler chain for a request's settings,
a grammar applied the way llama.cpp's common sampler applies it, and reusable candidate arrays.

Gemma's vocabulary is 262,144 tokens: every pass over a row costs (filling the chain's
candidates ~0.15 ms, its top-k ~0.1 ms), so the greedy pick reads the row in place and the
grammar and top-k are first tried on a shortlist of the tokens near the best logit.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import llama_cpp
import llama_cpp._internals
import numpy as np

from modeld.errors import InvalidRequestError
from modeld.wire.options import Sampling

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
#: When the chain's pick breaks the grammar, the grammar is checked on the tokens within
#: these logit margins of the best (at most SHORTLIST of them) before the whole vocabulary:
#: e^-8 and e^-24 of the best token's probability at temperature 1.
SHORTLIST_MARGINS = (8.0, 24.0)
SHORTLIST = 4096
#: The margins below the best logit tried for a top-k shortlist, widest last. Gemma-3-270m,
#: 90 sampled steps: tokens within 8 of the best median 231 (at least 40 in 91% of the rows),
#: within 12 median 1,902 (up to 9,981, past SHORTLIST: then the full chain).
TOP_K_MARGINS = (8.0, 14.0, 24.0)


def make_sampler(llm: llama_cpp.Llama, sampling: Sampling) -> llama_cpp._internals.LlamaSampler:
    """The sampler chain for these settings (``Llama._init_sampler``'s order: penalties, then
    greedy, or top-k, typical, top-p, min-p, temperature and a seeded draw), seeded with
    ``llm``'s seed: one per request, so a seed gives the same text."""
    s = sampling
    chain = llama_cpp._internals.LlamaSampler()  # type: ignore[no-untyped-call]
    last_n = s.repeat_last_n if s.repeat_last_n >= 0 else int(llm.n_ctx())
    chain.add_penalties(int(llm.n_vocab()), last_n, s.repeat_penalty, s.frequency_penalty,
                        s.presence_penalty)  # fmt: skip
    if s.greedy:
        chain.add_greedy()  # type: ignore[no-untyped-call]
    else:
        chain.add_top_k(s.top_k)
        chain.add_typical(1.0, 1)
        chain.add_top_p(s.top_p, 1)
        chain.add_min_p(s.min_p, 1)
        chain.add_temp(s.temperature)
        chain.add_dist(llm._seed)
    return chain


def plain_greedy(s: Sampling) -> bool:
    """Greedy with neutral penalties: the first highest logit is the chain's choice."""
    return s.greedy and s.repeat_penalty == 1.0 and not s.frequency_penalty \
        and not s.presence_penalty  # fmt: skip


def shortlist_top_k(s: Sampling) -> int:
    """The chain's ``top_k`` when its candidates may be shortlisted (:meth:`PromptState.sample`):
    sampled, with neutral penalties (so no logit moves before top-k) and 0 < top_k; else 0."""
    neutral = s.repeat_penalty == 1.0 and not s.frequency_penalty and not s.presence_penalty
    return s.top_k if not s.greedy and neutral and 0 < s.top_k <= SHORTLIST else 0


class Grammar:
    """One sequence's grammar sampler, applied as llama.cpp's common sampler does: the token
    the chain picks is checked alone (cheap), and only when the grammar rejects it are the
    full candidates masked and picked again. The daemon checked the grammar parses; a NULL
    here (never expected) is still an error, not a crash."""

    def __init__(self, llm: llama_cpp.Llama, gbnf: str) -> None:
        self.ptr = llama_cpp.llama_sampler_init_grammar(llm._model.vocab, gbnf.encode(), b"root")
        if not self.ptr:
            raise InvalidRequestError("llama.cpp rejected the reply's grammar",
                                      hint="check the format or the tools' parameters")
        self._one = (llama_cpp.llama_token_data * 1)()
        self._short = Candidates(SHORTLIST)

    def allows(self, token: int, logit: float) -> bool:
        one = self._one[0]
        one.id, one.logit, one.p = token, logit, 0.0  # type: ignore[assignment]
        arr = llama_cpp.llama_token_data_array(
            data=ctypes.cast(self._one, llama_cpp.llama_token_data_p), size=1, selected=-1,
            sorted=False)  # fmt: skip
        llama_cpp.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        return bool(np.isfinite(self._one[0].logit))

    def pick(self, row: Any, sampler: llama_cpp._internals.LlamaSampler | None,
             full: Callable[[], Candidates]) -> int:
        """A token the grammar allows, by the chain (``sampler``) or greedily (None).

        The grammar is checked first on the tokens whose logit is within a margin of the
        best (a few, or a few hundred: not all 262k of Gemma's vocabulary, which costs a
        step's time): when one of them is allowed, every token outside is less likely than
        it, so the greedy pick is exactly the full masking's. The whole vocabulary is masked
        only when none near the top is allowed."""
        top = float(row.max())
        for margin in SHORTLIST_MARGINS:
            ids = np.flatnonzero(row >= top - margin)
            if len(ids) > SHORTLIST:
                break
            cur = self._short.fill_ids(row, ids.astype(np.int32))
            self.mask(cur)
            if np.isfinite(self._short.view["logit"][: len(ids)]).any():
                return self._choose(self._short, cur, sampler)
        cands = full()
        cur = cands.fill(row)
        self.mask(cur)
        return self._choose(cands, cur, sampler)

    @staticmethod
    def _choose(cands: Candidates, cur: Any,
                sampler: llama_cpp._internals.LlamaSampler | None) -> int:
        if sampler is None:  # the first highest logit among the allowed
            view = cands.view[: cur.size]
            best = np.flatnonzero(view["logit"] == view["logit"].max())
            return int(view["id"][best].min())
        llama_cpp.llama_sampler_apply(sampler.sampler, ctypes.byref(cur))
        return cands.selected(cur)

    def mask(self, cur: Any) -> None:
        llama_cpp.llama_sampler_apply(self.ptr, ctypes.byref(cur))

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self.ptr, token)

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_sampler_free(self.ptr)
            self.ptr = None


class Candidates:
    """A reusable candidate array (ids set once per fill: samplers reorder it; 262k for
    Gemma)."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self.data = (llama_cpp.llama_token_data * n_vocab)()
        self.view = np.frombuffer(memoryview(self.data).cast("B"), dtype=_TOKEN_DATA)
        self.ids = np.arange(n_vocab, dtype=np.int32)

    def fill(self, row: Any) -> Any:
        """Candidates in token order with ``row``'s logits, as a llama_token_data_array."""
        self.view["id"] = self.ids
        self.view["logit"] = row
        self.view["p"] = 0.0
        return self._array(self.n_vocab)

    def fill_ids(self, row: Any, ids: Any) -> Any:
        """Candidates ``ids`` (at most the array's size) with their logits from ``row``."""
        n = len(ids)
        self.view["id"][:n] = ids
        self.view["logit"][:n] = row[ids]
        self.view["p"][:n] = 0.0
        return self._array(n)

    def _array(self, n: int) -> Any:
        return llama_cpp.llama_token_data_array(
            data=ctypes.cast(self.data, llama_cpp.llama_token_data_p),
            size=n, selected=-1, sorted=False)  # fmt: skip

    def selected(self, cur: Any) -> int:
        if not 0 <= cur.selected < cur.size:
            raise RuntimeError(f"the sampler selected no token ({cur.selected})")
        return int(self.data[cur.selected].id)

    def pick(self, sampler: llama_cpp._internals.LlamaSampler, row: Any, *,
             accept: bool = True) -> int:
        """What ``llama_sampler_sample`` does: candidates, the chain, (its accept)."""
        cur = self.fill(row)
        llama_cpp.llama_sampler_apply(sampler.sampler, ctypes.byref(cur))
        token = self.selected(cur)
        if accept:
            llama_cpp.llama_sampler_accept(sampler.sampler, token)
        return token

"""Does llama.cpp's own grammar sampler accept a text? (Tests of modeld.schema.)

The tiny generated model's vocabulary has a token for every byte (``<0xNN>``), so a text is fed
to a real llama.cpp grammar sampler one byte token at a time: each must survive the sampler's
masking and is then accepted; at the end the end-of-generation token must be allowed, which it
is only when the grammar is complete.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp


class ByteMatcher:
    def __init__(self, model: Path) -> None:
        self.llm = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
        self.vocab = self.llm._model.vocab
        self.byte_token: dict[int, int] = {}
        buf = ctypes.create_string_buffer(16)
        for tok in range(llama_cpp.llama_vocab_n_tokens(self.vocab)):
            if llama_cpp.llama_vocab_get_attr(self.vocab, tok) & llama_cpp.LLAMA_TOKEN_ATTR_BYTE:
                n = llama_cpp.llama_token_to_piece(self.vocab, tok, buf, 16, 0, True)
                if n == 1:
                    self.byte_token[buf.raw[0]] = tok
        assert len(self.byte_token) == 256, len(self.byte_token)
        self.eos = llama_cpp.llama_vocab_eos(self.vocab)

    def _allowed(self, sampler: int, token: int) -> bool:
        one = (llama_cpp.llama_token_data * 1)()
        one[0].id, one[0].logit, one[0].p = token, 0.0, 0.0
        arr = llama_cpp.llama_token_data_array(
            data=ctypes.cast(one, llama_cpp.llama_token_data_p), size=1, selected=-1,
            sorted=False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(arr))
        return bool(one[0].logit > -1e30)

    def matches(self, gbnf: str, text: str) -> bool:
        """Whether ``text`` is a complete sentence of ``gbnf``."""
        sampler = llama_cpp.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        assert sampler, "llama.cpp rejected the grammar"
        try:
            for byte in text.encode():
                token = self.byte_token[byte]
                if not self._allowed(sampler, token):
                    return False
                llama_cpp.llama_sampler_accept(sampler, token)
            return self._allowed(sampler, self.eos)
        finally:
            llama_cpp.llama_sampler_free(sampler)

"""A tiny llama model whose weights are *constructed*, not trained and not random, so that
greedy decoding writes chosen replies: the model for the real-agent tests (test_agents_real.py).

Why: a real agent (Claude Code, Codex) only completes its tool loop when the model emits a tool
call in the syntax modeld parses, and then answers after the tool's result. No small trained
model does that reliably, and a random-weight one writes noise. So the replies are scripted in
the weights; everything around them is real: llama.cpp tokenizes the agent's whole prompt with
a real 32k-piece SentencePiece vocabulary (gemma 3's most frequent pieces, so a 20k-token agent
prompt stays 20k tokens) and runs the real forward pass over it, and the Qwen 2.5 chat template
makes modeld parse Hermes ``<tool_call>`` blocks.

How the weights decide (one layer, FFN zero, RoPE made position-blind by a huge base):

- every token embeds as ``bias + slot``: a chain token (one written in a reply) has a slot of
  its own; a marker token its own; every other token shares the ``null`` slot;
- one attention head, whose query is constant and whose key is non-zero only on marker tokens,
  finds the strongest marker anywhere in the context (a later marker of ``Script.modes``
  outweighs an earlier one: its key is larger) and adds that marker's *mode* to the residual;
- the output matrix maps each chain token to the next one of its reply (a bigram chain; every
  token of every reply is distinct, so its successor is unique) and the last one to EOS; where
  replies share a token (the prompt's last token, ``<tool_call>``) the mode picks the successor,
  and with no marker the default reply wins.

What a test on it proves: the HTTP wire the agent speaks, modeld's chat templating and Hermes
tool-call parsing, the agent's tool loop (a reply that depends on a token found only in the
tool's output proves that output reached the model's prompt), and the prompt cache across
turns. What it does not prove: anything about a trained model's judgement — the replies are
fixed by the marker tokens the test writes into its prompts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

import ggufgen

TEMPLATE = Path(__file__).parent / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
CONTROL, USER_DEFINED, BYTE, NORMAL = 3, 4, 6, 1
#: The Qwen 2.5 special tokens this model's template and replies use (renamed gemma slots).
SPECIALS = (("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL), ("<|endoftext|>", CONTROL),
            ("<tool_call>", USER_DEFINED), ("</tool_call>", USER_DEFINED),
            ("<tool_response>", USER_DEFINED), ("</tool_response>", USER_DEFINED))  # fmt: skip
N_PIECES = 32000  # the most frequent gemma pieces kept
N_EMBD = 128
N_FF = 32  # the FFN is all zeros (llama.cpp's graph needs one)
HEAD = 8  # one small head: attention over a 20k-token prompt is the model's main cost
A = 16.0  # output weight of a chain step: greedy margins of 30 nats and more


@dataclass(frozen=True)
class Script:
    """The replies: ``default`` with no marker in the context, else the reply of the strongest
    marker present (``modes``: (marker text, reply), weakest first). Markers are single tokens
    (user-defined, matched anywhere in a prompt); replies are written token by token."""

    default: str
    modes: tuple[tuple[str, str], ...]


# --- The vocabulary --------------------------------------------------------------------------


def gemma_vocab(path: str | os.PathLike[str]) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of a GGUF's vocabulary (read through llama.cpp: gguf-py
    takes 15 s over 262k strings)."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp could not read the vocabulary of {path}")
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        n = llama_cpp.llama_vocab_n_tokens(vocab)
        tokens = [llama_cpp.llama_vocab_get_text(vocab, i).decode() for i in range(n)]
        scores = [float(llama_cpp.llama_vocab_get_score(vocab, i)) for i in range(n)]
        types = [_type_of(llama_cpp.llama_vocab_get_attr(vocab, i)) for i in range(n)]
    finally:
        llama_cpp.llama_model_free(model)
    return tokens, scores, types


def _type_of(attr: int) -> int:
    """llama_token_attr bits -> GGUF token type (byte, user-defined, control, unknown, normal)."""
    for bit, kind in ((32, BYTE), (16, USER_DEFINED), (8, CONTROL), (1, 2)):
        if attr & bit:
            return kind
    return NORMAL


@dataclass
class Vocab:
    tokens: list[str]
    scores: list[float]
    types: list[int]

    def __post_init__(self) -> None:
        self.ids = {t: i for i, t in enumerate(self.tokens)}

    def piece_text(self, i: int) -> bytes:
        """What token ``i`` detokenizes to (SentencePiece: U+2581 is a space)."""
        t = self.tokens[i]
        if self.types[i] == BYTE:
            return bytes([int(t[3:5], 16)])
        return t.replace("\u2581", " ").encode()


def build_vocab(source: Vocab, markers: list[str]) -> Vocab:
    """Gemma's control tokens, bytes and ``N_PIECES`` most frequent pieces, then the Qwen
    specials and the script's markers in the place of gemma's unused slots."""
    keep = {i for i, k in enumerate(source.types) if k != NORMAL or _a_letter(source.tokens[i])}
    pieces = sorted((i for i, k in enumerate(source.types) if k == NORMAL),
                    key=lambda i: -source.scores[i])[:N_PIECES]  # fmt: skip
    ids = sorted(keep.union(pieces))
    tokens = [source.tokens[i] for i in ids]
    types = [source.types[i] for i in ids]
    scores = [source.scores[i] for i in ids]
    unused = [i for i, t in enumerate(tokens) if t.startswith("<unused")]
    for slot, (text, kind) in zip(unused, [*SPECIALS, *((m, USER_DEFINED) for m in markers)],
                                  strict=False):  # fmt: skip
        tokens[slot], types[slot] = text, kind
    return Vocab(tokens, scores, types)


def _a_letter(piece: str) -> bool:
    """A single character short of CJK: the alphabet the merges start from (its scores are
    the lowest, so the most frequent pieces alone would lack "4" or ".")."""
    text = piece.replace("\u2581", "")
    return len(text) == 1 and ord(text) < 0x3000


WINDOW = 24  # the longest piece tried (JSON and prose pieces are shorter)
LOOSE = "\x00"  # in a reply: optional whitespace (between JSON lexemes): "", " " or "\n"


def loose_json(value: Any) -> str:
    """``value`` as JSON with ``LOOSE`` between all lexemes, so that ``segment`` may space it
    out to find distinct tokens (a call object has many quotes, and each quote-token can be
    written once)."""
    import json

    if isinstance(value, dict):
        items = [f"{json.dumps(k)}{LOOSE}:{LOOSE}{loose_json(v)}" for k, v in value.items()]
        return "{" + LOOSE + f"{LOOSE},{LOOSE}".join(items) + LOOSE + "}"
    if isinstance(value, list):
        return "[" + LOOSE + f"{LOOSE},{LOOSE}".join(loose_json(v) for v in value) + LOOSE + "]"
    return json.dumps(value)


def segment(vocab: Vocab, text: str, used: set[int]) -> tuple[str, list[int]]:
    """The text written (``LOOSE`` marks resolved) and token ids that spell it, none in
    ``used`` and none twice (a chain step knows only its current token). Special tokens
    (``<tool_call>``) are themselves; the text between them is spelled by ``_spell``."""
    import re

    specials = "|".join(re.escape(t) for t, _ in SPECIALS)
    written, ids = "", list[int]()
    for part in re.split(f"({specials})", text):
        if part in vocab.ids and vocab.types[vocab.ids[part]] in (CONTROL, USER_DEFINED):
            got = (part, [vocab.ids[part]])
        else:
            got = _spell(vocab, part, used | set(ids)) if part else ("", [])
        written, ids = written + got[0], ids + got[1]
    if len(set(ids)) < len(ids) or used & set(ids):
        raise ValueError(f"{text!r} needs a token twice")
    return written, ids


def _spell(vocab: Vocab, text: str, used: set[int]) -> tuple[str, list[int]]:
    """Longest pieces first, byte tokens as the fallback, with backtracking."""
    data = text.encode()
    by_text: dict[bytes, list[int]] = {}
    for i, kind in enumerate(vocab.types):
        if kind in (NORMAL, BYTE) and vocab.piece_text(i) != b"\n":  # the prompt's last
            by_text.setdefault(vocab.piece_text(i), []).append(i)  # token stays outside
    gap = LOOSE.encode()[0]

    def spellings(pos: int, have: bytes) -> list[tuple[int, bytes]]:
        """(end, written) for each way to write the text from ``pos`` on, up to ``WINDOW``
        bytes: each LOOSE is nothing or a space."""
        out = [(pos, have)]
        if pos == len(data) or len(have) >= WINDOW:
            return out
        if data[pos] == gap:
            return out + [e for ws in (b"", b" ", b"\n") for e in spellings(pos + 1, have + ws)]
        return out + spellings(pos + 1, have + data[pos:pos + 1])

    def found(pos: int) -> list[tuple[int, bytes, list[int]]]:
        return sorted(((end, w, by_text[w]) for end, w in set(spellings(pos, b""))
                       if w in by_text), key=lambda e: (-len(e[1]), e[1], e[0]))

    edges = [found(pos) for pos in range(len(data))]
    # (ties broken by text, not by the set's order: that follows the per-process hash seed,
    # and about 2% of orders spelled an earlier reply with a token the last one needed)
    for options in edges:  # a piece before the byte token of the same text
        for _, _, ids in options:
            ids.sort(key=lambda i: vocab.types[i] == BYTE)
    future: list[frozenset[int]] = [frozenset()] * (len(data) + 1)
    for pos in range(len(data) - 1, -1, -1):
        future[pos] = future[pos + 1].union(*(ids for _, _, ids in edges[pos]))
    failed: set[tuple[int, frozenset[int]]] = set()

    def walk(pos: int, taken: frozenset[int]) -> list[tuple[int, bytes]] | None:
        if all(b == gap for b in data[pos:]):  # the end, or only gaps left: nothing
            return []
        key = (pos, taken & future[pos])
        if key in failed:
            return None
        for end, written, ids in edges[pos]:
            for i in ids:
                if i not in taken:
                    rest = walk(end, taken | {i})
                    if rest is not None:
                        return [(i, written), *rest]
        failed.add(key)
        return None

    found = walk(0, frozenset(used))
    if found is None:
        raise ValueError(f"no segmentation of {text!r} into unused distinct tokens")
    return b"".join(w for _, w in found).decode(), [i for i, _ in found]


# --- The weights ---------------------------------------------------------------------------


@dataclass
class Layout:
    """Residual dimensions: 0 bias, 1 the null slot, then one slot per marker, one mode per
    marker, and one slot per chain token."""

    markers: list[int]  # marker token ids, weakest first
    chain: dict[int, int]  # chain token id -> its slot
    #: (token id or None for "any other token", mode or None for "no marker") -> next token
    steps: dict[tuple[int | None, int | None], int]
    written: list[str]  # each reply as written (default first), its LOOSE gaps resolved

    def slot(self, token: int | None) -> int:
        if token is None:
            return 1
        if token in self.markers:
            return 2 + self.markers.index(token)
        return self.chain[token]

    def mode_dim(self, mode: int) -> int:
        return 2 + len(self.markers) + mode


def plan(vocab: Vocab, script: Script, eos: int) -> Layout:
    """Each reply's tokens and which token follows which (in which mode)."""
    markers = [vocab.ids[m] for m, _ in script.modes]
    replies: list[tuple[int | None, str]] = [(None, script.default)]
    replies += [(k, reply) for k, (_, reply) in enumerate(script.modes)]
    steps: dict[tuple[int | None, int | None], int] = {}
    chain: dict[int, int] = {}
    written: list[str] = []
    used = set(markers)
    for mode, reply in replies:
        text, ids = segment(vocab, reply, used)  # distinct across replies: only the start
        written.append(text)  # (the prompt's last token) has a successor per mode
        used |= set(ids)
        for prev, nxt in zip([None, *ids], [*ids, eos], strict=True):
            steps[(prev, mode)] = nxt
        for i in ids:
            chain.setdefault(i, 2 + 2 * len(markers) + len(chain))
    if len(markers) > HEAD - 2:  # values use head dims 0.., queries and keys the last two
        raise ValueError(f"at most {HEAD - 2} markers")
    if 2 + 2 * len(markers) + len(chain) > N_EMBD:
        raise ValueError(f"the replies need {len(chain)} distinct tokens: too many for {N_EMBD}")
    return Layout(markers, chain, steps, written)


def weights(layout: Layout, n_vocab: int) -> dict[str, np.ndarray]:
    """The constructed tensors (numpy shapes: out x in)."""
    d = N_EMBD
    emb = np.zeros((n_vocab, d), np.float32)
    emb[:, 0] = 1.0
    emb[:, 1] = 1.0  # the null slot ...
    for tok in [*layout.markers, *layout.chain]:
        emb[tok, 1] = 0.0  # ... except for markers and chain tokens, which have their own
        emb[tok, layout.slot(tok)] = 1.0
    norm = np.sqrt(d / 2)  # every embedding is two ones: rmsnorm scales it by this
    wq = np.zeros((HEAD, d), np.float32)
    wk = np.zeros((HEAD, d), np.float32)
    wv = np.zeros((HEAD, d), np.float32)
    wo = np.zeros((d, HEAD), np.float32)
    wq[HEAD - 2, 0] = 1.0  # the last rope pair: with freq_base 1e12 it turns by < 1e-4 rad
    for m, tok in enumerate(layout.markers):
        score = 24.0 * (m + 1)  # a later marker outweighs an earlier one by e^24
        wk[HEAD - 2, layout.slot(tok)] = score * np.sqrt(HEAD) / (norm * norm)
        wv[m, layout.slot(tok)] = 1.0
        wo[layout.mode_dim(m), m] = 1.0 / norm
    out = np.zeros((n_vocab, d), np.float32)
    by_prev: dict[int | None, dict[int | None, int]] = {}
    for (prev, mode), nxt in layout.steps.items():
        by_prev.setdefault(prev, {})[mode] = nxt
    for prev, nexts in by_prev.items():
        col = layout.slot(prev)
        if len(set(nexts.values())) == 1:
            out[next(iter(nexts.values())), col] = A
            continue
        for mode, nxt in nexts.items():  # a branch: the mode picks, no marker -> the default
            if mode is None:
                out[nxt, col] = A / 2 + A / 4
            else:
                out[nxt, col] = A / 2
                out[nxt, layout.mode_dim(mode)] = A / 2
    ones = np.ones(d, np.float32)
    return {"token_embd.weight": emb, "output_norm.weight": ones, "output.weight": out,
            "blk.0.attn_norm.weight": ones, "blk.0.attn_q.weight": wq,
            "blk.0.attn_k.weight": wk, "blk.0.attn_v.weight": wv, "blk.0.attn_output.weight": wo,
            "blk.0.ffn_norm.weight": ones, "blk.0.ffn_gate.weight": np.zeros((N_FF, d), np.float32),
            "blk.0.ffn_up.weight": np.zeros((N_FF, d), np.float32),
            "blk.0.ffn_down.weight": np.zeros((d, N_FF), np.float32)}  # fmt: skip


def replay(layout: Layout, w: dict[str, np.ndarray], mode: int | None, eos: int,
           limit: int = 200) -> tuple[list[int], float]:
    """The greedy reply in ``mode`` computed from the weights in numpy (the attention taken as
    exactly the strongest marker), and the smallest margin between best and second logit."""
    out = w["output.weight"]
    tok: int | None = None
    got: list[int] = []
    margin = float("inf")
    while len(got) < limit:
        x = np.zeros(N_EMBD, np.float32)
        x[0] = 1.0
        x[layout.slot(tok)] = 1.0
        if mode is not None:
            x[layout.mode_dim(mode)] += 1.0
        x = x / np.sqrt(np.mean(x * x) + 1e-5)
        logits = out @ x
        best = int(np.argmax(logits))
        second = float(np.partition(logits, -2)[-2])
        margin = min(margin, float(logits[best]) - second)
        got.append(best)
        if best == eos:
            break
        tok = best
    return got, margin


def make_agent_model(path: str | os.PathLike[str], script: Script,
                     vocab_source: str | os.PathLike[str], *, context_length: int = 65536
                     ) -> Path:  # fmt: skip
    """Write the scripted model to ``path`` (vocabulary from ``vocab_source``, a gemma 3 GGUF);
    refuses when a reply would not come out as scripted (checked in numpy first)."""
    vocab = build_vocab(Vocab(*gemma_vocab(vocab_source)), [m for m, _ in script.modes])
    eos = vocab.ids["<|im_end|>"]
    layout = plan(vocab, script, eos)
    w = weights(layout, len(vocab.tokens))
    for mode, text in zip([None, *range(len(script.modes))], layout.written, strict=True):
        got, margin = replay(layout, w, mode, eos)
        spelled = b"".join(vocab.piece_text(t) for t in got[:-1]).decode()
        if got[-1] != eos or spelled != text or margin < 20:
            raise ValueError(f"mode {mode}: {spelled!r} (margin {margin:.1f}), not {text!r}")
    def kv(wr: gguf.GGUFWriter) -> None:
        wr.add_type("model")
        wr.add_name("modeld-scripted-agent")
        wr.add_file_type(1)
        wr.add_quantization_version(gguf.GGML_QUANT_VERSION)
        wr.add_tokenizer_model("llama")
        wr.add_tokenizer_pre("default")
        wr.add_token_list(vocab.tokens)
        wr.add_token_scores(vocab.scores)
        wr.add_token_types(vocab.types)
        wr.add_bos_token_id(vocab.ids["<bos>"])
        wr.add_eos_token_id(eos)
        wr.add_unk_token_id(vocab.ids["<unk>"])
        wr.add_pad_token_id(vocab.ids["<|endoftext|>"])
        wr.add_add_bos_token(False)
        wr.add_add_eos_token(False)
        wr.add_add_space_prefix(False)
        wr.add_chat_template(TEMPLATE.read_text())
        wr.add_context_length(context_length)
        wr.add_embedding_length(N_EMBD)
        wr.add_block_count(1)
        wr.add_feed_forward_length(N_FF)
        wr.add_head_count(1)
        wr.add_head_count_kv(1)
        wr.add_key_length(HEAD)
        wr.add_value_length(HEAD)
        wr.add_rope_dimension_count(HEAD)
        wr.add_rope_freq_base(1e12)
        wr.add_layer_norm_rms_eps(1e-5)
        wr.add_vocab_size(len(vocab.tokens))

    tensors = [ggufgen._Tensor(name, a.shape, "f16" if a.ndim == 2 else "f32", _const(a))
               for name, a in w.items()]
    return ggufgen._write(path, "llama", kv, tensors)


def _const(a: np.ndarray) -> Callable[[], np.ndarray]:
    return lambda: a


# --- The scripts of the agent tests ----------------------------------------------------------

TOOL = "\u27e6use a tool\u27e7"  # in a test's prompt: asks for the tool call
COMMAND = "echo MODELD$((40+2))"  # the shell computes 42 ...
RESULT = "MODELD42"  # ... so this token reaches a prompt only in the tool's output
HELLO = "Hello from modeld."
DONE = "The command printed 42."
#: The tool call each agent's shell tool takes (Claude Code's Bash, Codex's exec_command).
CALLS = {"claude": {"name": "Bash", "arguments": {"command": COMMAND}},
         "codex": {"name": "exec_command", "arguments": {"cmd": COMMAND}}}  # fmt: skip
VERSION = 2  # bump when the model built from a script changes


def agent_script(agent: str) -> Script:
    """Hello with no marker; the agent's shell call when asked for a tool; after the tool's
    output (``RESULT`` is stronger than ``TOOL``), the answer that cites it."""
    call = "<tool_call>" + loose_json(CALLS[agent]) + "</tool_call>"
    return Script(HELLO, ((TOOL, call), (RESULT, DONE)))


def cached_agent_model(cache_dir: str | os.PathLike[str], agent: str,
                       vocab_source: str | os.PathLike[str]) -> Path:  # fmt: skip
    """Build (once) the scripted model for ``agent`` into ``cache_dir``."""
    import dataclasses

    source = Path(vocab_source)
    params = {"script": dataclasses.asdict(agent_script(agent)), "v": VERSION,
              "vocab": [source.name, source.stat().st_size], "pieces": N_PIECES}  # fmt: skip
    path = Path(cache_dir) / f"scripted-{agent}-{ggufgen.params_key('scripted', params)}.gguf"
    if not path.exists():
        make_agent_model(path, agent_script(agent), source)
    return path

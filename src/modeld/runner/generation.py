"""A runner's KV state: prompt evaluation, prompt-state snapshots and token decoding.

Replaces ``Llama.generate``'s prefix logic (which reuses the longest common prefix, so the
decode batches, and with them llama.cpp's CPU logits, depended on the previous request). This
class knows exactly which tokens the KV cache holds and how many leading positions are
*stable* (equal to a fresh aligned evaluation), follows a :func:`modeld.runner.promptplan.plan` for
each prompt, and keeps snapshots in a :class:`modeld.runner.promptcache.SnapshotStore`.

Decoding goes through llama-cpp-python's batch and context wrappers directly (``Llama.eval``
would drop the KV cells after ``n_tokens`` and keep its own token list); logits are read with
``llama_get_logits_ith(ctx, -1)`` (``Llama.scores`` is not written with ``logits_all=False``).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp._internals
import numpy as np

from modeld.runner import promptfile, promptplan
from modeld.runner.promptcache import Checkpoint, Snapshot, SnapshotStore, snapshot_bytes
from modeld.runner.sampling import SHORTLIST, TOP_K_MARGINS, Candidates, Grammar

log = logging.getLogger("modeld.runner")

#: The most prompt tokens a sampled request evaluates per step. Messages (a cancel, a vanished
#: client) are read between steps, so this bounds how long a caller that left keeps the model
#: busy: 128 tokens of gemma-3-270m are ~0.5 s on 2 cores where 512 (n_batch) were ~2 s
#: (issue 21), for a few % of prompt throughput (architecture.md: aligned 128-token pieces cost
#: +3-5% against 512-token batches). Greedy requests use aligned pieces of the same size.
FAST_PIECE = 128


@dataclass(frozen=True)
class Reused:
    """How a prompt was made ready: tokens reused (not evaluated) and where they came from."""

    reused: int
    source: str  # "exact", "snapshot", "checkpoint", "live" or "none"


class DecodeBatch:
    """llama-cpp-python's batch filled token by token: each token with its position, its
    sequence and whether its logits are wanted (``LlamaBatch.set_batch`` knows only seq 0)."""

    def __init__(self, llm: llama_cpp.Llama) -> None:
        self.llm = llm
        self.batch = llm._batch.batch
        self.capacity = int(llm.n_batch)
        self.n = 0

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        """Append one token; returns its index in the batch (its logits row, when wanted)."""
        b, i = self.batch, self.n
        if i >= self.capacity:
            raise ValueError(f"a decode batch holds at most {self.capacity} tokens")
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
        b.seq_id[i][0] = seq
        self.n = i + 1
        return i

    def decode(self) -> None:
        """Evaluate the tokens added since the last decode (then the batch is empty again)."""
        if self.try_decode() != 0:
            raise RuntimeError("llama_decode returned 1")

    def try_decode(self) -> int:
        """:meth:`decode`, but ``llama_decode``'s 1 (no cells for the batch, nothing written:
        runner/kvpool.py) is returned, not raised; other failures raise as there."""
        self.batch.n_tokens, self.n = self.n, 0
        code = int(llama_cpp.llama_decode(self.llm._ctx.ctx, self.batch))
        if code not in (0, 1):
            raise RuntimeError(f"llama_decode returned {code}")
        return code


class PromptState:
    """One sequence of a generate-mode context (``seq``), tracked token by token.

    A runner decoding several sequences has one per sequence, sharing one snapshot ``store``;
    the shared decode calls are made by :mod:`modeld.runner.batch`, which tells each state what
    was evaluated (:meth:`begin`, :meth:`evaluated`, :meth:`prompt_done`, :meth:`decoded`).
    """

    def __init__(
        self,
        llm: llama_cpp.Llama,
        cache_bytes: int,
        align: int = promptplan.ALIGN,
        *,
        seq: int = 0,
        store: SnapshotStore | None = None,
    ) -> None:
        self.llm = llm
        self.ctx = llm._ctx.ctx
        self.seq = seq
        self.shared = int(llama_cpp.llama_n_seq_max(self.ctx)) > 1  # other sequences in the KV
        self.n_batch = int(llm.n_batch)
        # a piece must fit the batch llama-cpp-python allocated (n_batch may be set below C)
        self.align = max(1, min(align, self.n_batch))
        self.n_vocab = int(llm.n_vocab())
        self.n_swa = int(llama_cpp.llama_model_n_swa(llm._model.model))
        # a sliding-window cache that drops old cells (not swa_full) is rewound by checkpoints,
        # one every window's worth of prompt (whole pieces) and one at each prompt's end
        windowed = self.n_swa > 0 and not bool(llm.context_params.swa_full)
        self.checkpoint_every = max(self.align, self.n_swa - self.n_swa % self.align) \
            if windowed else 0
        self.store = store if store is not None else SnapshotStore(cache_bytes)
        self.tokens: list[int] = []  # what the KV cache holds, position by position
        self.stable = 0
        self._pending: Any = None  # logits row of an exact hit, sampled before any decode
        self._candidates: Candidates | None = None  # made on first use
        self._short: Candidates | None = None  # a shortlist's candidates, made on first use
        self.row: Any = None  # the logits row of the latest sample()
        self._stable_before = 0  # the stable prefix before the prompt's latest piece
        self._last: promptplan.Piece = (0, 0)  # the prompt's latest piece
        self._alone = True  # every piece of the prompt so far was decoded without other tokens
        #: the tokens that open a reply (the runner sets them from the chat format): a
        #: reproducible prompt's pieces also end after each (promptplan.turn_marks)
        self.turn_marker: tuple[int, ...] = ()
        self._layout = promptplan.Layout(self.align)  # the current prompt's (images, marks)
        # set by persist(): where close() saves the snapshots, and what that file holds now
        self._saved_at: tuple[Path, promptfile.Identity] | None = None
        self._on_disk: tuple[Snapshot, ...] = ()

    # ---------------------------------------------------------------- KV bookkeeping

    def _clear(self) -> None:
        self.store.drop_checkpoints(self.seq)
        if self.shared:
            llama_cpp.llama_memory_seq_rm(self._memory(), self.seq, -1, -1)
        else:  # also puts the cache head back at cell 0, as a fresh context has it
            self.llm._ctx.kv_cache_clear()  # type: ignore[no-untyped-call]

    def reset(self) -> None:
        """Forget the KV cache (after a warm-up, or when its content is unknown)."""
        self._clear()
        self.tokens, self.stable, self._pending = [], 0, None
        self.llm.n_tokens = 0

    def _memory(self) -> Any:
        return llama_cpp.llama_get_memory(self.ctx)

    def _truncate(self, keep: int) -> int:
        """Drop positions from ``keep`` on; returns what is really kept (0 when the model cannot
        drop a suffix, or when a sliding-window cache no longer holds the cells ``keep`` needs)."""
        if keep <= 0:
            self.reset()
            return 0
        ok = keep >= min(self._cut_min(), len(self.tokens))
        ok = ok and bool(llama_cpp.llama_memory_seq_rm(self._memory(), self.seq, keep, -1))
        if not ok:
            self.reset()
            return 0
        del self.tokens[keep:]
        self.stable = min(self.stable, keep)
        self.store.drop_checkpoints(self.seq, keep)
        return keep

    def _cut_min(self) -> int:
        """The shortest prefix this sequence's cells can be cut to: a sliding-window cache
        keeps only the last ``n_swa`` positions' cells, so a kept prefix must still see a whole
        window (llama-server's rule ``pos_min <= keep - n_swa``); 0: any prefix."""
        if self.n_swa <= 0 or not self.tokens:
            return 0
        pos_min = int(llama_cpp.llama_memory_seq_pos_min(self._memory(), self.seq))
        return 0 if pos_min <= 0 else pos_min + self.n_swa

    def evaluated(self, piece: promptplan.Piece, part: Sequence[int], *, alone: bool) -> None:
        """``part`` (positions ``piece``) is now in the KV cache. ``alone``: it was the only
        content of its decode call; a piece decoded beside other sequences' tokens never counts
        as stable (llama.cpp's CPU results depend on the batch's shape)."""
        self._stable_before, self._last = self.stable, piece
        self._alone = self._alone and alone
        if alone:
            self.stable = self._layout.stable_after(self.stable, piece)
        else:
            self.stable = min(self.stable, piece[0])
        self.tokens.extend(part)
        self.llm.n_tokens = len(self.tokens)
        if self.checkpoint_every:
            cks = self.store.checkpoints(self.seq)
            last = cks[-1].n if cks else 0
            if len(self.tokens) >= last + self.checkpoint_every:
                self._checkpoint()

    def _checkpoint(self) -> None:
        """Save this sequence's sliding-window cells as they are after its tokens so far."""
        n = len(self.tokens)
        if not self.store.enabled or n <= self.n_swa:  # the live cells still rewind there
            return
        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = int(llama_cpp.llama_state_seq_get_size_ext(self.ctx, self.seq, flags))
        if size <= 0 or size > self.store.budget_bytes:
            return
        state = (ctypes.c_uint8 * size)()
        written = int(llama_cpp.llama_state_seq_get_data_ext(self.ctx, state, size, self.seq,
                                                             flags))
        if written:
            self.store.add_checkpoint(Checkpoint(self.seq, n, state, written))

    def _rewind(self, n: int) -> bool:
        """Cut the live cells back to the checkpoint at ``n`` and restore its window cells."""
        ck = next((c for c in self.store.checkpoints(self.seq) if c.n == n), None)
        if ck is None or n > len(self.tokens):
            return False
        llama_cpp.llama_memory_seq_rm(self._memory(), self.seq, n, -1)
        read = llama_cpp.llama_state_seq_set_data_ext(
            self.ctx, ck.state, ck.size, self.seq, llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        if read != ck.size:
            log.warning("prompt cache: a checkpoint restore read %d of %d bytes", read, ck.size)
            self.reset()
            return False
        del self.tokens[n:]
        # the window cells land in other cells than a fresh evaluation's (as a snapshot's)
        self.stable = 0
        self.store.drop_checkpoints(self.seq, n)
        self.llm.n_tokens = n
        return True

    def failed(self) -> None:
        """A shared decode holding this sequence's tokens failed: its cells are unknown."""
        self.reset()

    # ---------------------------------------------------------------- the prompt

    def begin(
        self, prompt: Sequence[int], reproducible: bool,
        spans: Sequence[promptplan.Span] = (),
    ) -> tuple[Reused, list[promptplan.Piece]]:
        """Plan ``prompt``: restore or keep what can be reused, and return the pieces still to
        evaluate (none for an exact hit, whose logits :meth:`sample` then uses). ``spans``: the
        positions of its images (each a piece of its own, never reused in part).

        ``reproducible`` (greedy): aligned pieces, stable reuse only, so the logits are
        bitwise those of a fresh evaluation.
        """
        prompt = list(prompt)
        self._pending = None
        self._alone = True
        self._layout = promptplan.Layout.of(prompt, self.align, spans, self.turn_marker)
        snaps = self.store.snapshots()
        live = promptplan.Cached(self.tokens, self.stable, cut_min=self._cut_min())
        marks = [c.n for c in self.store.checkpoints(self.seq)]
        choice = promptplan.plan(prompt, live, [s.view() for s in snaps], reproducible,
                                 self._layout, marks)
        source = "live"
        if choice.source == promptplan.CHECKPOINT:
            if self._rewind(choice.keep):
                source = "checkpoint"
            else:
                choice = promptplan.ReusePlan(-1, 0)
        elif choice.source >= 0:
            snap = snaps[choice.source]
            if self._restore(snap):
                self.store.use(snap)
                if choice.exact:
                    self._pending = snap.logits
                    return Reused(len(prompt), "exact"), []
                source = "snapshot"
            else:
                choice = promptplan.ReusePlan(-1, 0)
        keep = self._truncate(choice.keep)
        self._stable_before, self._last = self.stable, (keep, keep)
        todo = self._layout.pieces(keep, len(prompt), reproducible, min(self.n_batch, FAST_PIECE))
        return Reused(keep, source if keep else "none"), todo

    def drop_logits(self) -> None:
        """An exact hit whose stored logits will not be sampled (a resumed reply's next token
        is known): the next :meth:`sample` reads the next decode's."""
        self._pending = None

    def prompt_done(self, n_prompt: int, logits_index: int = -1) -> None:
        """The whole prompt is evaluated and its logits are row ``logits_index`` of the last
        decode: keep a snapshot of it (if it fits)."""
        stable = self._alone and self._layout.logits_stable(self._stable_before, self._last,
                                                            n_prompt)
        if self.checkpoint_every:
            cks = self.store.checkpoints(self.seq)
            if not cks or cks[-1].n != n_prompt:
                self._checkpoint()
        self._snapshot(stable, logits_index)

    def _restore(self, snap: Snapshot) -> bool:
        self._clear()
        # The sequence API, not llama_state_set_data: restoring a whole context state leaves the
        # cache head at cell 0, so sliding-window layers put the next tokens in other cells than
        # a fresh evaluation does (logits differed by 1e-3); a sequence restore places them.
        read = llama_cpp.llama_state_seq_set_data(self.ctx, snap.state, snap.state_size, self.seq)
        if read != snap.state_size:
            log.warning("prompt cache: a restore read %d of %d bytes", read, snap.state_size)
            self.store.discard(snap.tokens)
            self.reset()
            return False
        self.tokens, self.stable = list(snap.tokens), snap.stable
        self.llm.n_tokens = len(self.tokens)
        return True

    def _snapshot(self, logits_stable: bool, logits_index: int = -1) -> None:
        """Keep the state just evaluated (the whole prompt, before any decode) if it fits."""
        store = self.store
        if not store.enabled:
            return
        tokens = tuple(self.tokens)
        logits_size = 4 * self.n_vocab
        size = int(llama_cpp.llama_state_seq_get_size(self.ctx, self.seq))
        if not store.wants(tokens, snapshot_bytes(size, logits_size, len(tokens)), logits_stable):
            store.skipped += 1
            return
        state = (ctypes.c_uint8 * size)()
        written = int(llama_cpp.llama_state_seq_get_data(self.ctx, state, size, self.seq))
        row = llama_cpp.llama_get_logits_ith(self.ctx, logits_index)
        if not written or not row:
            return
        logits = (ctypes.c_float * self.n_vocab)()
        ctypes.memmove(logits, row, logits_size)
        stable, cut_min = self.stable, self._cut_min()
        if 0 < self.n_swa < len(tokens):
            # A sequence state leaves out sliding-window cells older than the window, so a
            # restore lays the cache out differently from a fresh evaluation and later logits
            # differ slightly (measured 1e-3): fine for sampled requests, not for greedy ones.
            # Restored, it cannot be cut back at all (the live cells' older window cells are
            # not in it): planned as cuttable to their pos_min + n_swa, a branch chose it and
            # then started over from 0 (issue 47).
            stable, logits_stable, cut_min = 0, False, len(tokens)
        store.add(Snapshot(tokens, state, written, logits, logits_size, stable, logits_stable,
                           cut_min))

    # ---------------------------------------------------------------- across evictions

    def persist(self, directory: Path, model_path: str) -> int:
        """Keep the snapshots across this model's eviction, in ``directory``: read back what an
        earlier runner saved for this model file and context shape (:meth:`close` writes them).
        Returns the snapshots restored."""
        if not self.store.enabled:
            return 0
        st = os.stat(model_path)
        identity: promptfile.Identity = {
            "path": os.path.realpath(model_path), "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "n_ctx": int(self.llm.n_ctx()),
            "n_batch": self.n_batch, "align": self.align, "llama_cpp": llama_cpp.__version__,
            "turn_marker": list(self.turn_marker),  # (stable counts follow the marks)
        }
        self._saved_at = (directory, identity)
        restored = self._adopt(promptfile.file_for(directory, identity), identity)
        self._on_disk = tuple(self.store.snapshots())
        return restored

    def _adopt(self, path: Path, identity: promptfile.Identity) -> int:
        """Add the snapshots ``path`` holds for ``identity`` to the store; how many."""
        snaps = promptfile.read(
            path, identity,
            lambda b: (ctypes.c_uint8 * len(b)).from_buffer_copy(b),
            lambda b: (ctypes.c_float * (len(b) // 4)).from_buffer_copy(b),
        )
        return sum(self.store.add(s) for s in snaps if s.logits_size == 4 * self.n_vocab)

    def _handoff_identity(self) -> promptfile.Identity:
        return {"handoff": "snapshots", "n_vocab": self.n_vocab,
                "llama_cpp": llama_cpp.__version__}

    def hand_off_snapshots(self, path: str) -> int:
        """Write the snapshot store (all sequences share it) for the runner that reloads the
        model with a larger context, which :meth:`take_snapshots`: a sequence state restores
        into any context size, so the prompts evaluated here stay exact hits and cut points
        there (the live cells alone may not be cuttable where the next prompt leaves them: a
        sliding-window cache, a reply that does not come back as the tokens decoded). Returns
        the snapshots written."""
        snaps = self.store.snapshots()
        if not snaps or not promptfile.write(Path(path), self._handoff_identity(), snaps):
            return 0
        return len(snaps)

    def take_snapshots(self, path: str) -> int:
        """Add the snapshots another runner's :meth:`hand_off_snapshots` wrote; how many."""
        return self._adopt(Path(path), self._handoff_identity())

    def close(self) -> None:
        """The model is being closed: write the snapshots where :meth:`persist` said (unless
        the file already holds exactly these), then drop them from memory."""
        if self._saved_at is not None:
            directory, identity = self._saved_at
            snaps = tuple(self.store.snapshots())
            if snaps != self._on_disk or not promptfile.touch(directory, identity):
                promptfile.save(directory, identity, snaps, self.store.budget_bytes)
            self._saved_at, self._on_disk = None, ()
        self.store.clear()

    def hand_off(self, path: str) -> int:
        """Write this sequence's cells and tokens to ``path`` for the runner that reloads the
        model with a larger context (:mod:`.handoff`); the tokens written (0: none)."""
        n = len(self.tokens)
        if n == 0:
            return 0
        tokens = (llama_cpp.llama_token * n)(*self.tokens)
        written = llama_cpp.llama_state_seq_save_file(self.ctx, path.encode(), self.seq, tokens, n)
        return n if written else 0

    def take_over(self, path: str, stable: int) -> int:
        """Restore the cells another runner wrote to ``path`` into this sequence; the tokens
        restored (0: none, the sequence is then empty). ``stable`` is the writer's count:
        restored cells equal the evaluation they came from (the sliding-window rule of
        :meth:`_snapshot` still applies)."""
        cap = int(llama_cpp.llama_n_ctx_seq(self.ctx))
        out = (llama_cpp.llama_token * cap)()
        count = ctypes.c_size_t(0)
        self.reset()
        read = llama_cpp.llama_state_seq_load_file(self.ctx, path.encode(), self.seq, out, cap,
                                                   ctypes.byref(count))
        if not read or not count.value:
            self.reset()
            return 0
        self.tokens = list(out[: count.value])
        self.stable = 0 if 0 < self.n_swa < len(self.tokens) else min(stable, len(self.tokens))
        self.llm.n_tokens = len(self.tokens)
        return len(self.tokens)

    # ---------------------------------------------------------------- tokens

    def sample(
        self,
        sampler: llama_cpp._internals.LlamaSampler,
        logits_index: int = -1,
        *,
        greedy: bool = False,
        grammar: Grammar | None = None,
        top_k: int = 0,
    ) -> int:
        """The next token, from row ``logits_index`` of the last decode or an exact hit's
        stored row (kept as :attr:`row` for :meth:`logprobs`). ``greedy`` (temperature 0,
        neutral penalties): the first highest logit, read in place: the chain would first copy
        all n_vocab logits into candidates (262k for Gemma: ~4% of a step). ``grammar``: the
        token must be one it allows (:class:`Grammar`). ``top_k`` (from
        :func:`shortlist_top_k`): the chain starts with top-k on unmoved logits, so it is given
        only the tokens within a margin of the best (at least ``top_k`` of them) instead of all
        n_vocab: the same top-k, the same draw, 0.10 instead of 0.26 ms a token for Gemma
        (8 sequences: ~3% of a step)."""
        in_context = self._pending is None
        if in_context:
            ptr = llama_cpp.llama_get_logits_ith(self.ctx, logits_index)
            row = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        else:
            logits, self._pending = self._pending, None
            row = np.frombuffer(memoryview(logits).cast("B"), np.float32, self.n_vocab)
        self.row = row
        if greedy:
            token = int(np.argmax(row))
            if grammar is not None and not grammar.allows(token, float(row[token])):
                token = grammar.pick(row, None, self._cands)
        elif grammar is None and top_k and (picked := self._shortlisted(sampler, row, top_k)) >= 0:
            token = picked
        elif grammar is None and in_context:  # llama.cpp fills the candidates itself
            token = int(sampler.sample(self.llm._ctx, logits_index))
        else:
            token = self._cands().pick(sampler, row, accept=False)
            if grammar is not None and not grammar.allows(token, float(row[token])):
                token = grammar.pick(row, sampler, self._cands)
            llama_cpp.llama_sampler_accept(sampler.sampler, token)
        if grammar is not None:
            grammar.accept(token)
        return token

    def _shortlisted(self, sampler: llama_cpp._internals.LlamaSampler, row: Any,
                     top_k: int) -> int:
        """The chain's pick (accepted) among the tokens within a margin of the best logit,
        when at least ``top_k`` are (top-k keeps the same ones: none outside is higher); -1
        when the margins hold too few or too many."""
        best = float(row.max())
        for margin in TOP_K_MARGINS:
            ids = np.flatnonzero(row >= best - margin)
            if len(ids) > SHORTLIST:
                return -1
            if len(ids) >= top_k:
                if self._short is None:
                    self._short = Candidates(SHORTLIST)
                cur = self._short.fill_ids(row, ids.astype(np.int32))
                llama_cpp.llama_sampler_apply(sampler.sampler, ctypes.byref(cur))
                token = self._short.selected(cur)
                llama_cpp.llama_sampler_accept(sampler.sampler, token)
                return token
        return -1

    def _cands(self) -> Candidates:
        if self._candidates is None:
            self._candidates = Candidates(self.n_vocab)
        return self._candidates

    def logprobs(self, token: int, top: int) -> dict[str, Any]:
        """OpenAI's per-token entry for ``token`` from the row it was sampled from: its
        log-probability under the model (before sampling settings) and the ``top`` best."""
        row = self.row.astype(np.float64)
        peak = float(row.max())
        log_z = peak + float(np.log(np.exp(row - peak).sum()))
        entry: dict[str, Any] = {"id": token, "logprob": float(row[token]) - log_z}
        if top:
            best = np.argpartition(-row, top)[:top]
            best = best[np.argsort(-row[best], kind="stable")]
            entry["top"] = [(int(i), float(row[i]) - log_z) for i in best]
        return entry

    def decoded(self, token: int) -> None:
        """A sampled token was evaluated in a shared decode call (never stable)."""
        self.tokens.append(token)

"""The runner process: owns one llama_cpp.Llama and serves the daemon over the runner protocol.

Started by the daemon as ``python -m modeld.runner --endpoint EP --id RUNNER_ID``. It imports
llama_cpp at start-up (as do the generation and llama-log modules of this package), so a
pre-started spare runner has already paid for Python and the import. One process per model
because llama.cpp may abort the process on bad input, and process exit is the only sure way to
give memory back (docs/architecture.md, "Why these choices").

The loop serves one request at a time. During a generation it polls the socket between tokens
(and between prompt pieces) for ``cancel``/``shutdown``, so a cancel stops within one token.
The KV bookkeeping, prompt evaluation and prompt-state cache are in :mod:`modeld.runner.generation`.
It exits on ``shutdown`` and when its parent (the daemon) dies, so runners never leak.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp._internals
import llama_cpp.llama
import zmq

from modeld.errors import (
    ErrorCode,
    InsufficientMemoryError,
    InvalidModelError,
    InvalidRequestError,
    RpcWorkerError,
)
from modeld.model import probe
from modeld.model.memory import MiB
from modeld.rpc import ggml as ggmlrpc
from modeld.rpc import layout as rpcplan
from modeld.runner import chat, handoff, llamalog, llamaopen, prompting, rank, rpcload, specs
from modeld.runner.batch import BatchEngine
from modeld.runner.embedding import embed_inputs, embed_one, pooled
from modeld.runner.generation import PromptState
from modeld.runner.prepare import TokenBound, context_exceeded
from modeld.runner.promptcache import SnapshotStore
from modeld.runner.prompting import ModelChat, PromptText
from modeld.runner.template import render_template
from modeld.runner.transport import Interrupted, RunnerServer
from modeld.runner.vision import Vision, image_prompt
from modeld.wire import runnerwire as rp
from modeld.wire.replies import RunnerHello

log = logging.getLogger("modeld.runner")

_WARMUP_TEXT = b"Hello"
UNLOAD_GC_ABOVE = 16 * MiB  # held above the baseline after an unload: worth a full gc
#: count_tokens counts a text past the loaded context, even past the training context (an
#: agent sizing a document to split: 2 MB is 340k tokens for gemma-3, trained on 32k), up to
#: this many training contexts; past that its bytes alone refuse it and the daemon answers
#: that the model was trained for less (issue 45: 12 MB took a minute of tokenizing).
COUNT_CONTEXTS = 4


# --------------------------------------------------------------------------- memory


def _minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: max(0, v - before.get(k, 0)) for k, v in after.items()}


# --------------------------------------------------------------------------- the server


class Runner(RunnerServer):
    """Owns the model; the conversation rules are in RunnerServer."""

    def __init__(
        self, sock: zmq.Socket[bytes], runner_id: str, parent_pid: int,
        devices: Sequence[Mapping[str, Any]] = (), load_log: str | None = None,
    ) -> None:
        super().__init__(sock, runner_id, parent_pid)
        self.devices = [dict(d) for d in devices]  # ggml's, found before any thread started
        self.load_log = load_log  # llama.cpp's lines of the current load (read after a crash)
        self.baseline = probe.own_memory(gpu=True)
        self.llm: llama_cpp.Llama | None = None
        self.state: PromptState | None = None  # generate mode: sequence 0 (owns persistence)
        self.engine: BatchEngine | None = None  # generate mode: all sequences, decoded together
        self.token_bound: TokenBound | None = None  # the fewest tokens a prompt's bytes make
        self.vision: Vision | None = None  # the image projector, when loaded with one
        self.threads = 0
        self.mode = "generate"
        self.chat_format = chat.PLAIN
        self.template: str | None = None
        self.bos_text = ""
        self.eos_text = ""
        self.rpc: tuple[str, ...] | None = None  # workers registered (for good) in this process
        self.rpc_plan: list[rpcplan.Share] = []  # their planned shares

    def hello(self) -> RunnerHello:
        version = str(getattr(llama_cpp, "__version__", "?"))
        return rp.hello(
            os.getpid(), self.baseline, runner_id=self.runner_id, llama_cpp_version=version,
            rpc_supported=ggmlrpc.supported(), devices=self.devices,
        )  # fmt: skip

    def _register_rpc(self, spec: specs.LoadSpec) -> specs.LoadSpec | None:
        """Register the load's RPC workers (probed first: an unreachable or busy one is a
        ``load_failed`` naming it, never an abort; planned: a share that does not fit is one
        too). The spec to load with (n_ctx lowered to fit the workers); None: do not go on."""
        if self.rpc is not None and self.rpc != spec.rpc:
            self.send(rp.load_failed(
                ErrorCode.INTERNAL, f"this runner already registered rpc workers "
                f"{','.join(self.rpc)}; it cannot load with others", "retry the load",
            ))  # fmt: skip
            return None
        if not spec.rpc or self.rpc is not None:
            return spec
        try:
            spec, self.rpc_plan = rpcload.prepare(spec)
            self.rpc = spec.rpc  # even a partial registration stays: this process is tainted
            ggmlrpc.register(spec.rpc)
        except (RpcWorkerError, InsufficientMemoryError) as exc:
            log.warning("rpc workers: %s", exc)
            self.send(rp.load_failed(exc.code, exc.message, exc.hint, exc.details))
            return None
        return spec

    # ---------------------------------------------------------------- load

    def handle_load(self, msg: dict[str, Any]) -> None:
        """Open the model, set up what it serves with, warm it, take over a handoff, report.
        Each step that fails has sent its ``load_failed`` and left nothing loaded."""
        spec = specs.parse_load(msg)
        if self.llm is not None:
            log.info("replacing the loaded model")
            self._close()
        if not os.path.isfile(spec.path):
            self.send(
                rp.load_failed(
                    ErrorCode.MODEL_NOT_FOUND,
                    f"model file {spec.path} does not exist",
                    "check the path, or run 'modeld list' to see the models found",
                )
            )
            return
        planned = self._register_rpc(spec)
        if planned is None:
            return
        spec = planned
        t0 = time.perf_counter()
        llamalog.capture_start(self.load_log)
        try:
            llm = self._open(spec)
        finally:
            load_log = llamalog.capture_stop()
        load_s = time.perf_counter() - t0
        if llm is None or not self._configure(llm, spec):
            return
        t1 = time.perf_counter()
        if spec.warm_up:
            self.warm_up()
        warmup_s = time.perf_counter() - t1
        if spec.handoff and self.engine is not None:
            self._take_over(spec.handoff, spec.handoff_pid)
        self._report_loaded(llm, spec, load_log, load_s, warmup_s)

    def _open(self, spec: specs.LoadSpec) -> llama_cpp.Llama | None:
        """llama.cpp's model and context for ``spec``, or None (said) when it cannot load or
        is the wrong kind for the mode."""
        try:
            llm = llamaopen.open_llama(spec, min(spec.n_batch, spec.n_ctx))
            if spec.mode != "generate" and pooled(llm) and llm.n_batch < spec.n_ctx:
                # A pooling (embedding) model embeds an input in one batch, and non-causal
                # encoders need it in one ubatch: reopen with batch = context. Decoders keep
                # small batches (embedding.embed_one).
                llm.close()
                llm = llamaopen.open_llama(spec, spec.n_ctx)
        except (ValueError, RuntimeError, OSError) as exc:
            log.warning("load of %s failed: %s", spec.path, exc)
            self.send(
                rp.load_failed(
                    ErrorCode.INVALID_MODEL,
                    f"llama.cpp could not load {spec.path}: {exc}",
                    "the file may be truncated, corrupt or an unsupported architecture; "
                    "re-download it, or check 'modeld show' and the runner log for details",
                )
            )
            return None
        if (spec.mode == "rerank") != rank.is_reranker(llm):
            llm.close()
            kind = "a reranker" if spec.mode != "rerank" else "not a reranker (no rank pooling)"
            self.send(rp.load_failed(
                ErrorCode.INVALID_MODEL, f"{spec.path} is {kind}: it cannot be loaded to "
                f"{spec.mode}", "rerank with a reranker GGUF; use a reranker only to rerank",
            ))  # fmt: skip
            return None
        return llm

    def _configure(self, llm: llama_cpp.Llama, spec: specs.LoadSpec) -> bool:
        """Make ``llm`` this runner's: its template and chat format, its projector, and for a
        generating model the sequences, batch engine and prompt cache. False (said, closed)
        when the chat format or the projector is refused."""
        self.llm, self.mode, self.threads = llm, spec.mode, spec.n_threads
        meta = llm.metadata
        self.template = meta.get("tokenizer.chat_template") or None
        self.bos_text = _token_text(llm, llm.token_bos())
        self.eos_text = _token_text(llm, llm.token_eos())
        try:
            self.chat_format = chat.choose_format(
                meta.get("general.architecture", ""),
                self.template is not None,
                spec.chat_format,
                instruction_tuned=chat.is_instruction_tuned(meta),
            )
            if spec.mmproj is not None and spec.mode == "generate":
                self.vision = Vision.open(spec.mmproj, llm, spec.n_threads)
        except (InvalidRequestError, InvalidModelError) as exc:
            self._close()
            self.send(rp.load_failed(exc.code, exc.message, exc.hint))
            return False
        if spec.mode == "generate":
            store = SnapshotStore(spec.prompt_cache_mib * MiB)
            n_seq = int(llama_cpp.llama_n_seq_max(llm._ctx.ctx))
            states = [PromptState(llm, 0, seq=i, store=store) for i in range(n_seq)]
            self.state = states[0]
            marker = prompting.turn_marker(  # where a chat's turns start pieces
                self._chat_model(), render_template,
                lambda t: llm.tokenize(t.encode(), add_bos=False, special=True))
            for st in states:
                st.turn_marker = marker
            # several sequences: decoded in calls of fixed shapes, so greedy replies do not
            # depend on the batch (loaded without repacked weights: llamaopen.py)
            # one pool shared (kv_unified): a sequence's logits depend on the others' cells,
            # so no decode shape keeps greedy replies invariant (runner/kvpool.py)
            unified = llamaopen.unified(spec)
            self.engine = BatchEngine(llm, states, self, invariant=n_seq > 1 and not unified,
                                      max_rows=llamaopen.max_rows(n_seq), unified=unified)
            self.engine.chat_qa = self.chat_format == chat.QA
            self.engine.vision = self.vision
            self.token_bound = TokenBound(llm)
            if spec.prompt_cache_dir is not None:  # snapshots kept from its last eviction
                restored = self.state.persist(Path(spec.prompt_cache_dir), spec.path)
                if restored:
                    log.info("prompt cache: %d snapshot(s) restored from disk", restored)
        return True

    def _report_loaded(self, llm: llama_cpp.Llama, spec: specs.LoadSpec, load_log: list[str],
                       load_s: float, warmup_s: float) -> None:
        """Tell the daemon what was loaded: its context, sequences, memory and placement."""
        memory = probe.own_memory(gpu=True)
        parallel = len(self.engine.states) if self.engine is not None else 1
        unified = self.engine is not None and self.engine.unified
        n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(llm._ctx.ctx))  # the pool's, when unified
        self.send(
            rp.loaded(
                n_ctx=n_ctx_seq,
                parallel=parallel,
                # one sequence, or decode calls of fixed shapes (runner/microbatch.py; tested
                # on this CPU backend: tests/test_batch_invariance.py): batching never changes
                # a greedy token. Not claimed for RPC workers' backends (untested there), nor
                # for one pool of cells shared by the sequences (runner/kvpool.py).
                greedy_batch_invariant=parallel == 1 or not (spec.rpc or unified),
                kv_unified=unified,
                n_ctx_train=llm._model.n_ctx_train(),
                load_s=load_s,
                warmup_s=warmup_s,
                chat_format=self.chat_format,
                memory=memory,
                footprint=_minus(memory, self.baseline),
                mode=spec.mode,
                architecture=llm.metadata.get("general.architecture", ""),
                has_chat_template=self.template is not None,
                vision=self.vision is not None,
                **(rpcload.with_plan(ggmlrpc.load_report(load_log), self.rpc_plan)
                   if spec.rpc else ggmlrpc.load_report(load_log) if spec.gpu_layers else {}),
            )
        )
        log.info(
            "loaded %s n_ctx=%d x %d mode=%s in %.3fs (warm-up %.3fs), footprint %s",
            spec.path,
            n_ctx_seq,
            parallel,
            spec.mode,
            load_s,
            warmup_s,
            _minus(memory, self.baseline),
        )

    def warm_up(self) -> None:
        """One short evaluation so the first real request does not pay first-use costs."""
        assert self.llm is not None
        if self.mode == "embed":
            embed_one(self.llm, _WARMUP_TEXT.decode(), lambda: self.check_interrupt("warm-up"))
            return
        if self.mode == "rerank":
            text = _WARMUP_TEXT.decode()
            rank.score_pairs(self.llm, [rank.pair_tokens(self.llm, text, text)], lambda: None)
            return
        tokens = self.llm.tokenize(_WARMUP_TEXT, add_bos=True, special=False)
        self.llm.eval(tokens[:8])
        self.llm.reset()  # type: ignore[no-untyped-call]
        if self.state is not None:
            self.state.reset()

    def _close(self) -> None:
        """Close the model; its prompt snapshots go to disk (if asked) and out of memory."""
        if self.state is not None:
            self.state.close()  # the store all sequences share
            self.state = None
        self.engine = self.token_bound = None
        if self.vision is not None:
            self.vision.close()
            self.vision = None
        if self.llm is not None:
            self.llm.close()
            self.llm = None

    # ---------------------------------------------------------------- generate

    def _require(self, mode: str) -> llama_cpp.Llama:
        if self.llm is None:
            raise InvalidRequestError("this runner has no model loaded", hint="send 'load' first")
        if self.mode != mode:
            raise InvalidRequestError(
                f"the model is loaded in {self.mode} mode, not {mode}",
                hint=f"load it with mode={mode!r}",
            )
        return self.llm

    def _chat_model(self) -> ModelChat:
        return ModelChat(self.chat_format, self.template, self.bos_text, self.eos_text)

    def prompt_tokens(self, spec: specs.GenerateSpec) -> tuple[list[int], PromptText]:
        """Tokens of the prompt, and its text with the stop strings of its format and how to
        read the reply (:mod:`modeld.runner.prompting`)."""
        llm = self._require("generate")
        prompt = prompting.build(spec, self._chat_model(), render_template)
        if spec.has_images:
            return image_prompt(self.vision, spec, prompt)
        data = prompt.text.encode("utf-8")
        limit = self.engine.n_ctx_seq if self.engine is not None else 0
        # refused from its bytes when they prove it cannot fit (prepare.TokenBound); looked
        # at only past 8 bytes a token, shorter than any real vocabulary's longest piece
        if spec.count_only:  # counted past the loaded context, not past all reason
            limit = COUNT_CONTEXTS * llm._model.n_ctx_train()
        if limit and len(data) > 8 * limit and self.token_bound:
            least = self.token_bound.at_least(len(data))
            if least >= limit:
                raise context_exceeded(least, limit, at_least=True)
        tokens = llm.tokenize(data, add_bos=prompt.add_bos, special=True)
        if not tokens:
            raise InvalidRequestError("the prompt is empty", hint="give some prompt text")
        return tokens, prompt

    def apply_threads(self, n_threads: int | None) -> None:
        """Use the thread count the daemon chose for this request: when several runners
        generate at once they share the cores, and llama.cpp's spinning threads slow everyone
        down many times over when the cores are oversubscribed."""
        if self.llm is None or not n_threads or n_threads == self.threads:
            return
        self.llm._ctx.set_n_threads(n_threads, n_threads)
        self.threads = n_threads

    def handle_generate(self, msg: dict[str, Any]) -> None:
        """Serve this request and every one that arrives while it runs, decoded together."""
        spec = specs.parse_generate(msg)
        self._require("generate")
        assert self.engine is not None
        self.engine.run(spec)

    # ---------------------------------------------------------------- embed

    def handle_embed(self, msg: dict[str, Any]) -> None:
        spec = specs.parse_embed(msg)
        self.apply_threads(spec.n_threads)
        llm = self._require("embed")
        t0 = time.perf_counter()
        try:
            vectors, total = embed_inputs(llm, spec.inputs, lambda: self.check_interrupt(spec.rid))
        except Interrupted as exc:
            self.send(rp.error(spec.rid, ErrorCode.CANCELLED, f"embedding stopped: {exc.reason}"))
            return
        elapsed = time.perf_counter() - t0
        self.send(rp.done_embed(spec.rid, vectors, total, elapsed, memory=probe.own_memory()))

    def handle_rerank(self, msg: dict[str, Any]) -> None:
        spec = specs.parse_rerank(msg)
        self.apply_threads(spec.n_threads)
        llm = self._require("rerank")
        t0 = time.perf_counter()
        pairs = [rank.pair_tokens(llm, spec.query, doc) for doc in spec.documents]
        total = rank.check_pairs(pairs, min(llm.n_ctx(), llm.n_batch))
        try:
            scores = rank.score_pairs(llm, pairs, lambda: self.check_interrupt(spec.rid))
        except Interrupted as exc:
            self.send(rp.error(spec.rid, ErrorCode.CANCELLED, f"reranking stopped: {exc.reason}"))
            return
        elapsed = time.perf_counter() - t0
        self.send(rp.done_rerank(spec.rid, scores, spec.top_n, total, elapsed,
                                 memory=probe.own_memory()))  # fmt: skip

    def on_idle(self) -> None:
        """Give the heap's free pages back once requests stop: what a reply's buffers left
        behind would otherwise stay resident (tree_memory: 2-5 MiB per runner; ~1 ms)."""
        t0 = time.perf_counter()
        probe.malloc_trim()
        log.debug("idle: malloc_trim took %.2f ms", (time.perf_counter() - t0) * 1000)

    def handle_memory(self) -> None:
        memory = probe.own_memory(gpu=True)
        self.send(rp.memory_reply(memory, _minus(memory, self.baseline)))

    def handle_handoff(self, prefix: str) -> None:
        """Write each sequence's cells for the runner that reloads this model with a larger
        context (runner/handoff.py), then the manifest that says they are whole."""
        if not prefix:
            return
        entries: list[handoff.Entry] = []
        snaps = 0
        try:  # whatever fails, the manifest says what is there: the next runner never waits
            Path(prefix).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            for state in self.engine.states if self.engine is not None else []:
                path = handoff.seq_file(prefix, state.seq)
                if (n := state.hand_off(path)) > 0:
                    entries.append({"seq": state.seq, "file": path, "tokens": n,
                                    "stable": state.stable})
            if self.state is not None:
                snaps = self.state.hand_off_snapshots(handoff.snapshots_file(prefix))
        finally:
            handoff.write_manifest(prefix, entries)
        log.info("handoff: %d sequence(s), %d tokens written for the reload; %d snapshot(s)",
                 len(entries), sum(e["tokens"] for e in entries), snaps)

    def _take_over(self, prefix: str, writer: int | None) -> None:
        """Restore the sequences the model's previous runner wrote (and delete its files)."""
        assert self.engine is not None
        t0 = time.perf_counter()
        entries = handoff.wait_manifest(prefix, handoff.pid_alive(writer))
        states = {s.seq: s for s in self.engine.states}
        restored = sum(states[e["seq"]].take_over(str(e["file"]), int(e.get("stable", 0)))
                       for e in entries if e.get("seq") in states)
        snaps = self.engine.states[0].take_snapshots(handoff.snapshots_file(prefix))
        handoff.remove(prefix, entries)
        handoff.prune_stale(Path(prefix).parent)
        log.info("handoff: %d tokens restored in %.2f s; %d snapshot(s) added", restored,
                 time.perf_counter() - t0, snaps)

    def handle_unload(self) -> None:
        """Close the model and hand its memory back, keeping the process (llama_cpp imported)
        so the daemon can reuse it instead of starting a new one; the reply says how much is
        still held above the baseline, and the daemon stops the process if that is too much."""
        self._close()
        probe.malloc_trim()
        memory = probe.own_memory(gpu=True)
        if memory["rss"] - self.baseline["rss"] > UNLOAD_GC_ABOVE:  # a cycle may hold buffers
            gc.collect()  # 15-25 ms, so only when needed: the daemon's next load waits on this
            probe.malloc_trim()
            memory = probe.own_memory(gpu=True)
        # a process that turned ggml's tiled matmul off for good asks to be stopped, not reused
        self.send(rp.unloaded(memory, _minus(memory, self.baseline),
                              reusable=not llamaopen.turned_off_here()))


def _token_text(llm: llama_cpp.Llama, token: int) -> str:
    if token < 0:
        return ""
    raw = llama_cpp.llama_vocab_get_text(llm._model.vocab, token)
    return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw or "")

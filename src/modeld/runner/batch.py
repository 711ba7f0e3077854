"""Continuous batching: the runner's generate requests share the decode calls of each step.

Each request holds one sequence of the context (``parallel`` of them, each with its own KV
stream of ``n_ctx`` cells). A step evaluates the next pieces of prompts still being read (one
``llama_decode``, up to ``n_batch`` tokens), then the next token of every streaming sequence
(one ``llama_decode`` for all of them): a request that arrives while others stream joins at
the next step, and a long prompt is evaluated piece by piece between the others' tokens
instead of stalling them. Every sequence has its own sampler, stop strings, limits,
cancellation and ``done`` timings; messages are read between steps, so a cancel stops its
sequence within one step and leaves the others running.

With ``parallel`` 1 this is the single-stream loop of earlier runners: one sequence, decodes of
one token, prompts in their own (aligned, when greedy) pieces.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING, Any, Protocol

import llama_cpp
import llama_cpp._internals

from modeld.errors import ErrorCode, ModeldError
from modeld.runner import decodecall, kvpool, microbatch, resume, specs, verify
from modeld.runner.generation import DecodeBatch, PromptState
from modeld.runner.prepare import Prepared, Preparer, discard, preparing
from modeld.runner.prompting import PromptText
from modeld.runner.promptplan import Piece, common_prefix
from modeld.runner.sampling import make_sampler, plain_greedy, shortlist_top_k
from modeld.runner.stream import Stream
from modeld.runner.textstream import TextStream
from modeld.wire import runnerwire as rp

if TYPE_CHECKING:
    from modeld.runner.vision import Vision

log = logging.getLogger("modeld.runner")

#: A free sequence holding a prefix of a new prompt is chosen over the lowest free one when it
#: saves at least this many tokens of evaluation (about one step's worth on 2 cores).
MIN_REUSE = 32
RANDOM_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED: pick a random seed


class Host(Protocol):
    """What the engine needs from its runner: the prompt's tokens, replies, and the socket."""

    def prompt_tokens(self, spec: specs.GenerateSpec) -> tuple[list[int], PromptText]:
        """Called on the tokenizer thread (:mod:`modeld.runner.prepare`)."""

    def apply_threads(self, n_threads: int | None) -> None: ...

    def send(self, msg: Mapping[str, Any]) -> None: ...

    def between_steps(self, active: set[str]) -> list[dict[str, Any]]: ...


class BatchEngine:
    """Runs generate requests on ``parallel`` sequences of one context until none is left."""

    def __init__(self, llm: llama_cpp.Llama, states: list[PromptState], host: Host,
                 *, invariant: bool = False, max_rows: int = microbatch.MAX_ROWS,
                 unified: bool = False) -> None:
        self.llm = llm
        self.unified = unified  # the sequences share one pool of cells (kvpool.py)
        # greedy replies must not depend on the batch: decode calls of fixed shapes, at most
        # max_rows sequences each (microbatch.py); the model was loaded without repacked weights
        self.invariant, self.max_rows = invariant, max_rows
        self.states = states  # one per sequence id, sharing one snapshot store
        self.host = host
        self.vocab = llm._model.vocab
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(llm._ctx.ctx))
        self.batch = DecodeBatch(llm)
        self.streams: list[Stream] = []  # admitted, in arrival order
        # not admitted yet: their prompts being tokenized (off this loop), or no seq free
        self.waiting: deque[tuple[specs.GenerateSpec, Future[Prepared]]] = deque()
        self.preparer = Preparer(preparing(host.prompt_tokens, llm, self.n_ctx_seq))
        self.stop_all: str | None = None  # why every stream must end (shutdown, daemon gone)
        self.chat_qa = False  # set by the runner: replies start after "Answer:" (strip a space)
        self.vision: Vision | None = None  # set by the runner: its image projector (issue 38)
        self._markers: dict[str, int | None] = {}  # marker text -> its single token

    # ---------------------------------------------------------------- the loop

    def run(self, first: specs.GenerateSpec) -> None:
        """Serve ``first`` and every generate request that arrives meanwhile, to the end.

        An error no per-request handler caught ends every request still here with it (each
        gets its reply) instead of escaping with them in flight for good: a request left
        unanswered wedges its model (issue 21)."""
        self.submit(first)
        try:
            self._loop()
        except Exception as exc:
            log.exception("the batch loop failed; ending its %d request(s)",
                          len(self.streams) + len(self.waiting))
            text = f"{type(exc).__name__}: {exc}"
            for stream in list(self.streams):
                stream.state.failed()
                self.end(stream, rp.error(stream.rid, ErrorCode.INTERNAL, text))
            for spec, future in self.waiting:
                discard(future)
                self.host.send(rp.error(spec.rid, ErrorCode.INTERNAL, text))
            self.waiting.clear()

    def _loop(self) -> None:
        while self.streams or self.waiting:
            self._admit_ready()
            if not (self.streams and self._step()):
                self._wait_for_work()  # nothing to decode: no spinning while work is prepared
            self._read_messages()
            if self.stop_all is not None:
                for stream in list(self.streams):
                    self._cancel(stream, self.stop_all)
                for spec, future in self.waiting:
                    discard(future)
                    self.host.send(rp.error(spec.rid, ErrorCode.CANCELLED,
                                            f"generation stopped: {self.stop_all}"))
                self.waiting.clear()

    def submit(self, spec: specs.GenerateSpec) -> None:
        """Queue ``spec``; its prompt starts being tokenized now, on the tokenizer thread."""
        self.waiting.append((spec, self.preparer.start(spec)))

    def _admit_ready(self) -> None:
        """Admit the waiting requests whose prompts are ready, oldest first, while sequences
        are free (a count or a failed preparation needs none); a prompt still being tokenized
        holds back no one behind it."""
        for item in list(self.waiting):
            spec, future = item
            if not future.done():
                continue
            needs_seq = not spec.count_only and future.exception() is None
            if needs_seq and len(self.streams) >= len(self.states):
                continue
            self.waiting.remove(item)
            self._admit(spec, future)

    def _read_messages(self) -> None:
        active = {s.rid for s in self.streams} | {s.rid for s, _ in self.waiting}
        for msg in self.host.between_steps(active):
            kind = msg["type"]
            if kind == "stop":
                self.stop_all = str(msg["reason"])
            elif kind == "cancel":
                rid = msg.get("rid")
                for stream in self.streams:
                    if stream.rid == rid:
                        self._cancel(stream, "cancelled")
                        break
                else:
                    for item in list(self.waiting):
                        if item[0].rid == rid:
                            self.waiting.remove(item)
                            discard(item[1])
                            self.host.send(rp.error(rid, ErrorCode.CANCELLED,
                                                    "generation stopped: cancelled",
                                                    {"completion_tokens": 0}))
            elif kind == "generate":
                try:
                    self.submit(specs.parse_generate(msg))
                except ModeldError as exc:
                    self.host.send(rp.error(msg.get("rid"), exc.code, exc.message,
                                            exc.details, exc.hint))

    # ---------------------------------------------------------------- admission

    def _free_state(self, prompt: list[int]) -> PromptState:
        """The free sequence whose cache shares the longest prefix with ``prompt`` (at least
        :data:`MIN_REUSE` tokens), else the free sequence with the lowest id: busy sequences
        then stay consecutive, which is what lets one micro-batch hold them all (``_step``)."""
        busy = {s.seq for s in self.streams}
        free = [st for st in self.states if st.seq not in busy]

        def score(st: PromptState) -> tuple[int, int]:
            shared = common_prefix(st.tokens, prompt)
            return (shared if shared >= MIN_REUSE else 0, -st.seq)

        return max(free, key=score)

    def _admit(self, spec: specs.GenerateSpec, ready: Future[Prepared]) -> None:
        """Plan the tokenized prompt on a free sequence and make its sampler; errors (its
        preparation's too) are this request's reply only."""
        try:
            self.host.apply_threads(spec.n_threads)
            prep = ready.result()
            tokens, prompt, grammar = prep
            if spec.count_only:  # count_tokens: the prompt as it would run, evaluated never
                prep.discard()
                self.host.send(rp.done_generate(spec.rid, finish_reason="stop",
                                                prompt_tokens=len(tokens), prompt_tokens_reused=0,
                                                completion_tokens=0, prompt_eval_s=0.0,
                                                generation_s=0.0))  # fmt: skip
                return
            target = [*tokens, *spec.resume[:-1]]  # a resumed reply: what its cells held
        except ModeldError as exc:
            self.host.send(rp.error(spec.rid, exc.code, exc.message, exc.details, exc.hint))
            return
        except Exception as exc:  # e.g. text the tokenizer cannot encode: this request only
            log.exception("preparing request %s failed", spec.rid)
            self.host.send(rp.error(spec.rid, ErrorCode.INVALID_REQUEST,
                                    f"the prompt could not be prepared: {type(exc).__name__}: "
                                    f"{_printable(str(exc))}"))
            return
        if self.unified and spec.deterministic and not self.streams:
            kvpool.free_idle(self.states, set())  # alone in a pool as fresh as a new context's
        state = self._free_state(target)
        sampling = spec.sampling
        self.llm.set_seed(sampling.seed if sampling.seed >= 0 else RANDOM_SEED)
        stream = Stream(
            spec=spec,
            state=state,
            prompt=target,
            prompt_tokens=len(tokens),
            sampler=make_sampler(self.llm, sampling),
            text=TextStream((*sampling.stop, *prompt.stops)),
            strip_lead=not spec.raw and self.chat_qa,
            t0=time.perf_counter(),
            grammar=grammar,
            parser=prompt.parser(spec.forced_tools),
            preserve=self._marker_tokens(prompt.markers),
            media=prompt.media,
        )
        if spec.resume:
            resume.admit(self, stream)
            return
        # Greedy requests are reproducible: aligned pieces, stable reuse (generation.py).
        prepared, todo = state.begin(tokens, sampling.greedy, stream.spans)
        stream.reused, stream.todo = prepared.reused, deque(todo)
        self.encode_images(stream)
        self.streams.append(stream)
        if not todo:  # an exact hit: its logits are stored, sample now
            self.sampled(stream, self.sample(stream))

    def encode_images(self, stream: Stream) -> None:
        """Encode the images the stream still evaluates (on this thread: vision.py says why);
        those it reuses from the cache are never encoded."""
        if stream.media is None or self.vision is None:
            return
        todo = {start for start, _ in stream.todo}
        for (start, _), image in zip(stream.media.spans, stream.media.images, strict=True):
            if start in todo:
                try:
                    stream.encoded[start] = self.vision.embeddings(image)
                except Exception as exc:  # the request ends with it at the image's turn
                    stream.encoded[start] = exc
        stream.release()

    def _marker_tokens(self, markers: tuple[str, ...]) -> frozenset[int]:
        """The tokens that are each one of ``markers`` by themselves (cached per text)."""
        ids = []
        for marker in markers:
            if marker not in self._markers:
                tokens = self.llm.tokenize(marker.encode(), add_bos=False, special=True)
                self._markers[marker] = tokens[0] if len(tokens) == 1 else None
            token = self._markers[marker]
            if token is not None:
                ids.append(token)
        return frozenset(ids)

    # ---------------------------------------------------------------- one step

    def _wait_for_work(self) -> None:
        """No stream could take a step (none admitted yet): sleep until a preparation finishes
        (or 50 ms: a message may come) rather than spin a core beside the tokenizer."""
        pending = [f for _, f in self.waiting]
        if pending:
            wait(pending, timeout=0.05, return_when=FIRST_COMPLETED)

    def _step(self) -> bool:
        """One step: the next pieces of prompts still being evaluated (one decode call), then
        the next token of every streaming sequence (another), then sampling.

        Two calls, not one: with a KV stream per sequence llama.cpp splits a batch into
        micro-batches of equal tokens per sequence (``split_equal``), so a prompt piece beside
        decode tokens costs a second weight pass anyway; evaluating it first gives the new
        request its first token one pass sooner, and a piece alone in its call is *stable*
        (its logits equal a solo evaluation's, so it may be reused for greedy requests). The
        running streams wait at most one ``n_batch`` piece per step. False when there was
        nothing to decode."""
        calls = self._plan_pieces()
        for pieces in calls:
            self._decode_prompts(pieces)
        if calls:
            self._read_messages()  # a cancel sent meanwhile stops its stream before its 2nd token
            if self.stop_all is not None:
                return True
        streaming = sorted((s for s in self.streams if s.next_token is not None),
                           key=lambda s: s.seq)
        if not streaming:
            return bool(calls)
        drafts = verify.drafts(self, streaming)
        if not self.invariant or not any(s.spec.sampling.greedy for s in streaming):
            self._decode_tokens(streaming, drafts)  # no greedy row to keep invariant: one call
            return True
        by_seq = {s.seq: s for s in streaming}
        for seq, draft in drafts.items():  # a call of its own: 1 + len(draft) rows, no pad
            self._decode_tokens([by_seq.pop(seq)], {seq: draft})
        for call in microbatch.decode_calls(list(by_seq), self.max_rows):
            self._decode_tokens([by_seq[seq] for seq in call], pad=microbatch.needs_pad(
                len(call) == 1, len(by_seq[call[0]].state.tokens)))
        return True

    def _plan_pieces(self) -> list[list[tuple[Stream, Piece]]]:
        """The prompt parts to evaluate in this step, as decode calls: up to one batch, the
        oldest prompt first, in sequence-id order (llama.cpp puts consecutive sequence ids in
        one micro-batch). When greedy replies must not depend on the batch, a greedy prompt's
        piece is never cut and has a call of its own, as when it is evaluated alone."""
        room = self.batch.capacity
        shared: list[tuple[Stream, Piece]] = []
        calls: list[list[tuple[Stream, Piece]]] = []
        for stream in self.streams:  # arrival order
            if not stream.todo or room <= 0:
                continue
            start, end = stream.todo[0]
            if start in stream.encoded:  # an image: a call of its own
                stream.todo.popleft()
                calls.append([(stream, (start, end))])
                room -= min(room, end - start)
                continue
            if self.invariant and stream.spec.sampling.greedy:
                if end - start <= room:  # else it waits for the next step, whole
                    stream.todo.popleft()
                    calls.append([(stream, (start, end))])
                    room -= end - start
                continue
            if end - start > room:  # the rest of this piece goes in the next step
                stream.todo[0] = (start + room, end)
                end = start + room
            else:
                stream.todo.popleft()
            shared.append((stream, (start, end)))
            room -= end - start
        if shared:
            calls.append(sorted(shared, key=lambda p: p[0].seq))
        return calls

    def _decode_prompts(self, pieces: list[tuple[Stream, Piece]]) -> None:
        if len(pieces) == 1 and pieces[0][1][0] in pieces[0][0].encoded:
            self._decode_image(*pieces[0])
            return

        def fill(part: list[tuple[Stream, Piece]]) -> list[tuple[Stream, int]]:
            complete: list[tuple[Stream, int]] = []
            for stream, (start, end) in part:
                last = end == len(stream.prompt)
                for pos in range(start, end):
                    index = self.batch.add(stream.prompt[pos], pos, stream.seq,
                                           last and pos == end - 1)
                if last:
                    complete.append((stream, index))
            return complete

        def wait(part: list[tuple[Stream, Piece]]) -> None:  # back to the front, whole
            for stream, piece in part:
                stream.todo.appendleft(piece)

        pieces, complete = decodecall.decode(self, pieces, fill, wait)
        for stream, (start, end) in pieces:
            stream.state.evaluated((start, end), stream.prompt[start:end],
                                   alone=len(pieces) == 1)
        for stream, index in complete or ():
            if stream.resume_next is not None:  # a resumed reply: its next token is known
                stream.next_token, stream.resume_next = stream.resume_next, None
                continue
            # the first token goes out before the snapshot is copied (the time to first token);
            # the state and the logits row stay as they are until the next decode
            self.sampled(stream, self.sample(stream, index))
            stream.state.prompt_done(len(stream.prompt), index)

    def _decode_image(self, stream: Stream, piece: Piece) -> None:
        """Evaluate one image of ``stream``'s prompt from its embeddings, in calls of its own;
        an image that failed to encode or decode ends its request only."""
        assert self.vision is not None
        start, end = piece
        last = end == len(stream.prompt)
        rows = stream.encoded.pop(start)
        try:
            if isinstance(rows, Exception):  # its encoding failed (encode_images)
                raise rows
            index = self.vision.decode(rows, start, stream.seq, last)
        except ModeldError as exc:
            stream.state.failed()
            self.end(stream, rp.error(stream.rid, exc.code, exc.message, exc.details, exc.hint))
            return
        except Exception as exc:
            log.exception("an image of request %s failed", stream.rid)
            stream.state.failed()
            self.end(stream, rp.error(stream.rid, ErrorCode.INTERNAL,
                                       f"{type(exc).__name__}: {exc}"))
            return
        stream.state.evaluated(piece, stream.prompt[start:end], alone=True)
        if last:
            self.sampled(stream, self.sample(stream, index))
            stream.state.prompt_done(len(stream.prompt), index)

    def _decode_tokens(self, streaming: list[Stream], drafts: Mapping[int, list[int]] = {},
                       *, pad: bool = False) -> None:
        """The next token of each of ``streaming`` in one call, followed by the tokens a
        sequence drafted (``drafts``: verify.py). ``pad``: the one sequence gets a second query
        row at its next position (dropped after the call), so its attention is computed as
        beside other sequences (microbatch.py)."""
        tokens: list[tuple[Stream, int]] = []
        for stream in streaming:
            assert stream.next_token is not None
            tokens.append((stream, stream.next_token))
            stream.next_token = None
            stream.batched_max = max(stream.batched_max, len(streaming))

        def fill(part: list[tuple[Stream, int]]) -> list[int]:
            indices = []
            for s, token in part:
                pos = len(s.state.tokens)
                indices.append(self.batch.add(token, pos, s.seq, True))
                for j, drafted in enumerate(drafts.get(s.seq, ()), pos + 1):
                    self.batch.add(drafted, j, s.seq, True)
            if pad:  # its position is free: a stream decodes at most at n_ctx_seq - 2
                (stream, token), = part
                self.batch.add(token, len(stream.state.tokens) + 1, stream.seq, False)
            return indices

        decoded, indices = decodecall.decode(self, tokens, fill)
        if pad and decoded:
            (stream, _), = decoded
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.llm._ctx.ctx),
                                          stream.seq, len(stream.state.tokens) + 1, -1)
        for (stream, token), index in zip(decoded, indices or (), strict=True):
            stream.state.decoded(token)
            if stream.seq in drafts:
                verify.accept(self, stream, index, drafts[stream.seq])
            else:
                self.sampled(stream, self.sample(stream, index))

    @staticmethod
    def sample(stream: Stream, index: int = -1) -> int:
        sampling = stream.spec.sampling
        return stream.state.sample(stream.sampler, index, greedy=plain_greedy(sampling),
                                   grammar=stream.grammar, top_k=shortlist_top_k(sampling))

    def sampled(self, stream: Stream, token: int) -> None:
        """Handle one new token of ``stream``: end of generation, text, stop strings, limits."""
        now = time.perf_counter()
        if stream.t_first is None:
            stream.t_first = now
        if llama_cpp.llama_vocab_is_eog(self.vocab, token):
            stream.finish = "stop"
            self.done(stream)
            return
        if stream.spec.sampling.logprobs:
            stream.unsent_logprobs.append(stream.logprob(self.llm, token))
        stream.feed(self.llm, self.host.send, token)
        if now - stream.last_send >= stream.spec.chunk_interval_s:  # not one message a token
            stream.flush(self.host.send, now)
        if stream.text.stopped:
            stream.finish = "stop"
        elif stream.completion >= stream.spec.sampling.max_tokens:
            pass
        elif len(stream.state.tokens) + 1 < self.n_ctx_seq:  # a cell for it and one spare
            stream.next_token = token
            return
        else:
            stream.context_full = True
            if stream.spec.grow and stream.media is None:  # goes on in a larger context
                resume.pause(self, stream)
                return
        self.done(stream)

    # ---------------------------------------------------------------- endings

    def done(self, stream: Stream) -> None:
        self.end(stream, stream.finish_reply(self.host.send))

    def _cancel(self, stream: Stream, reason: str) -> None:
        details = {"completion_tokens": stream.completion, "prompt_tokens": stream.prompt_tokens}
        if stream.todo:  # its prompt is half evaluated: what the cache holds is still tracked
            stream.todo.clear()
        self.end(stream, rp.error(stream.rid, ErrorCode.CANCELLED,
                                   f"generation stopped: {reason}", details))

    def end(self, stream: Stream, reply: Mapping[str, Any]) -> None:
        """Free the sequence (its cache stays for the next prompt's reuse) and reply."""
        self.streams.remove(stream)
        stream.release()
        # its ~n_vocab x 12 B buffer sits in a reference cycle: free it now, not at GC
        stream.sampler.close()  # type: ignore[no-untyped-call]
        if stream.grammar is not None:
            stream.grammar.close()
        self.host.send(reply)


def _printable(text: str) -> str:
    """``text`` with anything UTF-8 cannot carry escaped, so the reply itself can be sent."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


"""Images on a runner's own sequences (issue 38), through llama.cpp's multimodal library
(libmtmd, llama-cpp-python's ``mtmd_cpp`` bindings).

What modeld takes from mtmd and what it keeps for itself: mtmd loads the projector, decodes
PNG/JPEG/GIF with its stb loader, splits a prompt into text and image chunks and encodes an
image into embeddings. The evaluation stays in modeld's batch loop (:mod:`.batch`): an image is
a span of positions of its request's sequence, one piece of its own (:mod:`.promptplan`), whose
embeddings are decoded here at the sequence's positions. Its positions hold a placeholder
token derived from the image's SHA-256, so prompt reuse and the prompt cache tell one image
from another without any other key: a repeated image and prefix is never encoded again.

Encoding (the vision tower, the slow part) runs on the batch loop's own thread, before the
request's first piece; its result is copied out at once (mtmd keeps one output buffer per
context). It used to run on a thread of its own beside the decoding, but ggml's OpenMP then
kept a second thread team in the process, and libgomp, finding more threads than cores, stops
spinning at barriers: every later decode of the runner was ~30% slower (29 tokens 29 -> 38 ms,
35 tokens 36 -> 46 ms on the bench's pair, 2 cores), more than the overlap gained.
Not supported yet: M-RoPE projectors (the Qwen2-VL family: their positions are not one per
token) and audio; a load with one is refused by name.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

from modeld.errors import InvalidModelError, InvalidRequestError
from modeld.model import memory
from modeld.runner import imagefile, llamalog, prompting
from modeld.runner.prompting import PromptText
from modeld.runner.promptplan import Span
from modeld.runner.specs import GenerateSpec
from modeld.wire import images

log = logging.getLogger("modeld.runner")


def placeholder(image_id: str) -> int:
    """The token every position of an image holds in modeld's bookkeeping: negative (no real
    token is) and one per image, from its SHA-256."""
    return -1 - int(image_id[:7], 16)


@dataclass(eq=False)
class Image:
    """One image of a prompt after tokenizing: its identity, its size in tokens, and mtmd's
    chunk (owned here until it is encoded, or freed unused)."""

    id: str
    n_tokens: int
    chunk: Any  # mtmd_input_chunk_p (a copy this object owns), None once freed

    def free(self) -> None:
        """Free the chunk; again is a no-op (freeing a freed chunk would crash)."""
        chunk, self.chunk = self.chunk, None
        if chunk:
            mtmd.mtmd_input_chunk_free(chunk)


@dataclass(frozen=True)
class Tokenized:
    tokens: list[int]
    spans: tuple[Span, ...]
    images: tuple[Image, ...]


class Vision:
    """A loaded projector beside a loaded text model."""

    def __init__(self, ctx: Any, llm: llama_cpp.Llama, path: str) -> None:
        self.ctx, self.llm, self.path = ctx, llm, path
        self.n_embd = int(llama_cpp.llama_model_n_embd_inp(llm._model.model))
        self.non_causal = bool(mtmd.mtmd_decode_use_non_causal(ctx, None))
        self.n_ubatch = int(llama_cpp.llama_n_ubatch(llm._ctx.ctx))
        self.capacity = int(llm.n_batch)
        self._batch = llama_cpp.llama_batch_init(self.capacity, self.n_embd, 1)
        self._encoded: OrderedDict[str, np.ndarray[Any, Any]] = OrderedDict()  # by image id
        # decoded images by id (memory.KEPT_BITMAP_BYTES), and their sizes in bytes; the
        # lock: the two tokenizer lanes (prepare.py) share them
        self._bitmaps: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._tokenizing = threading.Lock()

    @classmethod
    def open(cls, path: str, llm: llama_cpp.Llama, n_threads: int) -> Vision:
        """Load ``path`` for ``llm``; a projector that does not fit the model (another width,
        not an image projector, a kind modeld cannot place) is an InvalidModelError that says
        what llama.cpp found."""
        mtmd.mtmd_helper_log_set(llamalog.log_callback(), ctypes.c_void_p(0))
        params = mtmd.mtmd_context_params_default()
        params.use_gpu, params.n_threads = False, max(1, n_threads)
        params.print_timings, params.warmup = False, True
        llamalog.capture_start()
        try:
            ctx = mtmd.mtmd_init_from_file(path.encode(), llm._model.model, params)
        finally:
            lines = llamalog.capture_stop()
        hint = "use the mmproj file made for this model (same repository), or --mmproj"
        if not ctx:
            why = next((ln.strip() for ln in reversed(lines)
                        if "mismatch" in ln or "error" in ln.lower() or "failed" in ln), "")
            raise InvalidModelError(f"the projector {path} does not fit this model"
                                    + (f": {why}" if why else ""), hint=hint)  # fmt: skip
        problem = None
        if not mtmd.mtmd_support_vision(ctx):
            problem = "it has no vision encoder"
        elif mtmd.mtmd_decode_use_mrope(ctx):
            problem = "its model places images with M-RoPE (Qwen2-VL family): not supported yet"
        if problem is not None:
            mtmd.mtmd_free(ctx)
            raise InvalidModelError(f"the projector {path} cannot be used: {problem}", hint=hint)
        return cls(ctx, llm, path)

    def close(self) -> None:
        self._encoded.clear()
        with self._tokenizing:
            for bitmap, _ in self._bitmaps.values():
                mtmd.mtmd_bitmap_free(bitmap)
            self._bitmaps.clear()
        if self.ctx:
            mtmd.mtmd_free(self.ctx)
            self.ctx = None
        llama_cpp.llama_batch_free(self._batch)

    # ---------------------------------------------------------------- prompts

    def tokenize(self, parts: Sequence[str], datas: Sequence[bytes], add_bos: bool) -> Tokenized:
        """The tokens of ``parts`` with image ``datas`` between them (``len(parts) ==
        len(datas) + 1``): text tokens as llama.cpp makes them, each image as its placeholder
        repeated over its positions. Called on the tokenizer threads (mtmd_tokenize is)."""
        with self._tokenizing:
            return self._tokenize(parts, datas, add_bos)

    def _tokenize(self, parts: Sequence[str], datas: Sequence[bytes], add_bos: bool) -> Tokenized:
        decoded: dict[str, Any] = {}  # by id: an image sent twice in a request is decoded once
        bitmaps: list[Any] = []
        try:
            for i, data in enumerate(datas):
                image_id = images.image_id(data)
                if image_id not in decoded:
                    decoded[image_id] = self._bitmap(data, image_id, i)
                bitmaps.append(decoded[image_id])
            texts, items = [], []
            for i, text in enumerate(parts):
                if text:
                    raw = text.encode("utf-8")
                    texts.append(raw)
                    t = mtmd.mtmd_input_text(text=raw, text_len=len(raw), add_special=add_bos,
                                             parse_special=True)  # fmt: skip
                    items.append(mtmd.mtmd_input_part(text=ctypes.pointer(t), bitmap=None))
                if i < len(bitmaps):
                    items.append(mtmd.mtmd_input_part(text=None, bitmap=bitmaps[i]))
            array = (ctypes.POINTER(mtmd.mtmd_input_part) * len(items))(
                *(ctypes.pointer(p) for p in items))
            chunks = mtmd.mtmd_input_chunks_init()
            try:
                rc = mtmd.mtmd_tokenize_from_parts(self.ctx, chunks, array, len(items), add_bos)
                if rc != 0:
                    raise InvalidRequestError(
                        f"the images could not be prepared for the model (mtmd error {rc})",
                        hint="send PNG, JPEG, WebP or GIF images")  # fmt: skip
                return self._read(chunks)
            finally:
                mtmd.mtmd_input_chunks_free(chunks)
        finally:
            self._keep(decoded)

    def _bitmap(self, data: bytes, image_id: str, index: int) -> Any:
        """The image decoded (kept from an earlier request, or now), with ``image_id`` (the
        SHA-256 of its bytes) as the id mtmd gives its chunk."""
        kept = self._bitmaps.pop(image_id, None)  # out of the cache while in use: _keep
        if kept is not None:
            return kept[0]
        where = f"image {index + 1}"
        kind = images.check(data, where, InvalidRequestError)
        imagefile.check_pixels(data, kind, where)
        if kind == "webp":
            width, height, rgb = imagefile.decode_webp(data, where)
            bitmap = mtmd.mtmd_bitmap_init(width, height, (ctypes.c_uint8 * len(rgb))
                                           .from_buffer_copy(rgb))  # fmt: skip
        else:
            buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(data), False)
        if not bitmap:
            raise InvalidRequestError(f"{where} could not be decoded as {kind.upper()}",
                                      hint="send a valid PNG, JPEG, WebP or GIF file")
        mtmd.mtmd_bitmap_set_id(bitmap, image_id.encode())
        return bitmap

    def _keep(self, decoded: dict[str, Any]) -> None:
        """Keep the newest decoded images, up to :data:`memory.KEPT_BITMAP_BYTES` (agents
        resend the same screenshot every turn: its decode, ~2 ms for a 224-pixel PNG and tens
        of ms for a screen's, is done once); free the others."""
        for image_id, bitmap in decoded.items():
            size = int(mtmd.mtmd_bitmap_get_n_bytes(bitmap))
            if size > memory.KEPT_BITMAP_BYTES:
                mtmd.mtmd_bitmap_free(bitmap)
                continue
            self._bitmaps[image_id] = (bitmap, size)
        total = sum(size for _, size in self._bitmaps.values())
        while total > memory.KEPT_BITMAP_BYTES:
            bitmap, size = self._bitmaps.popitem(last=False)[1]
            mtmd.mtmd_bitmap_free(bitmap)
            total -= size

    def _read(self, chunks: Any) -> Tokenized:
        tokens: list[int] = []
        spans: list[Span] = []
        found: list[Image] = []
        try:
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                n = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
                if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    count = ctypes.c_size_t(0)
                    ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                    tokens.extend(ptr[: count.value])
                    continue
                if self.non_causal and n > self.n_ubatch:
                    raise InvalidRequestError(
                        f"an image is {n} tokens but this model evaluates at most "
                        f"{self.n_ubatch} at once", hint="send a smaller image")
                image_id = (mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode()
                found.append(Image(image_id, n, mtmd.mtmd_input_chunk_copy(chunk)))
                spans.append((len(tokens), len(tokens) + n))
                tokens.extend([placeholder(image_id)] * n)
        except BaseException:
            for image in found:
                image.free()
            raise
        return Tokenized(tokens, tuple(spans), tuple(found))

    # ---------------------------------------------------------------- evaluation

    def embeddings(self, image: Image) -> np.ndarray[Any, Any]:
        """The image's embeddings (n_tokens x n_embd), encoded now (on the calling thread: the
        batch loop's) unless kept from an earlier request (up to
        :data:`memory.KEPT_IMAGES`); the image's chunk is freed either way. Raises when the
        projector fails (the request that needs it ends with that: batch.py)."""
        kept = self._encoded.get(image.id)
        if kept is not None:
            self._encoded.move_to_end(image.id)
            return kept
        try:
            rows = self._encode(image)
        finally:
            image.free()
        self._encoded[image.id] = rows
        while len(self._encoded) > memory.KEPT_IMAGES:
            self._encoded.popitem(last=False)
        return rows

    def _encode(self, image: Image) -> np.ndarray[Any, Any]:
        if not image.chunk:
            raise InvalidRequestError("the image was released before it was encoded")
        rc = mtmd.mtmd_encode_chunk(self.ctx, image.chunk)
        if rc != 0:
            raise InvalidRequestError(f"the projector failed to encode the image ({rc})")
        out = mtmd.mtmd_get_output_embd(self.ctx)
        return np.ctypeslib.as_array(out, shape=(image.n_tokens, self.n_embd)).copy()

    def decode(self, rows: np.ndarray[Any, Any], pos: int, seq: int, logits: bool) -> int:
        """Evaluate an image's embeddings ``rows`` at positions ``pos...`` of sequence ``seq``,
        in calls of at most one batch (whole, with non-causal attention, where the model
        wants that); returns the logits row of its last position (``logits``) or -1."""
        ctx, batch = self.llm._ctx.ctx, self._batch
        n = len(rows)
        if self.non_causal:
            llama_cpp.llama_set_causal_attn(ctx, False)
        try:
            for first in range(0, n, self.capacity):
                part = rows[first:first + self.capacity]
                m = len(part)
                ctypes.memmove(batch.embd, np.ascontiguousarray(part, np.float32).ctypes.data,
                               m * self.n_embd * 4)  # fmt: skip
                for j in range(m):
                    batch.pos[j], batch.n_seq_id[j] = pos + first + j, 1
                    batch.seq_id[j][0] = seq
                    batch.logits[j] = logits and first + j == n - 1
                batch.n_tokens = m
                rc = llama_cpp.llama_decode(ctx, batch)
                if rc != 0:
                    raise RuntimeError(f"llama_decode of an image failed ({rc})")
        finally:
            if self.non_causal:
                llama_cpp.llama_set_causal_attn(ctx, True)
        return (n - 1) % self.capacity if logits else -1


def image_prompt(vision: Vision | None, spec: GenerateSpec,
                  prompt: PromptText) -> tuple[list[int], PromptText]:
    """The tokens of a prompt with images: its text around the image markers, and each
    image's positions (libmtmd's tokens). Called on the tokenizer thread."""
    if vision is None:
        raise InvalidRequestError(
            "this model cannot see images: it was loaded without an image projector (mmproj)",
            hint="put the model's mmproj file beside it, name it in the config ([mmproj] "
            "table), or load it with --mmproj; or send text only")  # fmt: skip
    datas = prompting.image_data(spec)  # checked when the request was parsed
    parts = prompt.text.split(prompting.IMAGE_MARKER)
    if len(parts) != len(datas) + 1:
        raise InvalidRequestError(
            f"the chat template kept {len(parts) - 1} of the request's {len(datas)} images",
            hint="the model's template drops (or repeats) message content; send a raw "
            "prompt with the images")  # fmt: skip
    done = vision.tokenize(parts, datas, prompt.add_bos)
    media = prompting.Media(done.spans, done.images)
    return done.tokens, dataclasses.replace(prompt, media=media)

"""The foundation of vision (issue 38), proven on llama-cpp-python's own mtmd bindings before
modeld wires anything: a generated projector (``ggufgen.make_mlp_projector``) loads beside a
generated text model of the same width, a prompt with an image marker tokenizes into text and
image chunks, and the image chunk's embeddings are evaluated into a chosen sequence at a
chosen position of a multi-sequence context. A projector of another width is refused.

Each check runs in a child process: a native abort must fail one test, not pytest.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ggufgen
import imageutil

pytestmark = pytest.mark.slow


SCRIPT = r"""
import ctypes, hashlib, json, sys
import numpy as np
import llama_cpp
from llama_cpp import mtmd_cpp as M

model, proj, *images = sys.argv[1:]
default = llama_cpp.llama_cpp.llama_context_default_params
def two_sequences():  # Llama has no n_seq_max argument (modeld's llamaopen does the same)
    params = default()
    params.n_seq_max, params.kv_unified = 2, False
    return params
llama_cpp.llama_cpp.llama_context_default_params = two_sequences
llm = llama_cpp.Llama(model, n_ctx=1024, n_batch=128, flash_attn=True, verbose=False,
                      n_threads=1)
llama_cpp.llama_cpp.llama_context_default_params = default
params = M.mtmd_context_params_default()
params.use_gpu, params.n_threads, params.warmup, params.print_timings = False, 1, False, False
ctx = M.mtmd_init_from_file(proj.encode(), llm._model.model, params)
if not ctx:
    print(json.dumps({"loaded": False}))
    sys.exit(0)
n_embd = llm.n_embd()
out = {"loaded": True, "marker": M.mtmd_default_marker().decode(),
       "non_causal": bool(M.mtmd_decode_use_non_causal(ctx, None)),
       "mrope": bool(M.mtmd_decode_use_mrope(ctx)), "runs": []}
for seq, name in enumerate(images):
    data = open(name, "rb").read()
    buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
    bitmap = M.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(data), False)
    text = b"<|im_start|>user\nwhat is " + M.mtmd_default_marker() + b" here?<|im_end|>\n"
    inp = M.mtmd_input_text(text=text, text_len=len(text), add_special=True,
                            parse_special=True)
    chunks = M.mtmd_input_chunks_init()
    rc = M.mtmd_tokenize(ctx, chunks, ctypes.byref(inp),
                         (M.mtmd_bitmap_p_ctypes * 1)(bitmap), 1)
    run = {"tokenize": rc, "chunks": []}
    pos = 0
    for i in range(M.mtmd_input_chunks_size(chunks)):
        chunk = M.mtmd_input_chunks_get(chunks, i)
        kind = M.mtmd_input_chunk_get_type(chunk)
        n = M.mtmd_input_chunk_get_n_tokens(chunk)
        last = i == M.mtmd_input_chunks_size(chunks) - 1
        batch = llama_cpp.llama_batch_init(n, n_embd if kind else 0, 1)
        if kind == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
            run["encode"] = M.mtmd_encode_chunk(ctx, chunk)
            ctypes.memmove(batch.embd, M.mtmd_get_output_embd(ctx), n * n_embd * 4)
            run["id"] = M.mtmd_input_chunk_get_id(chunk).decode()
        else:
            count = ctypes.c_size_t(0)
            tokens = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            for j in range(n):
                batch.token[j] = tokens[j]
        for j in range(n):  # into sequence `seq`, from position `pos`
            batch.pos[j], batch.n_seq_id[j], batch.logits[j] = pos + j, 1, last and j == n - 1
            batch.seq_id[j][0] = seq
        batch.n_tokens = n
        run["chunks"].append({"type": kind, "n_tokens": n,
                              "n_pos": M.mtmd_input_chunk_get_n_pos(chunk),
                              "decode": llama_cpp.llama_decode(llm._ctx.ctx, batch)})
        pos += n
        if last:
            row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, n - 1)
            run["argmax"] = int(np.argmax(np.ctypeslib.as_array(row, shape=(llm.n_vocab(),))))
        llama_cpp.llama_batch_free(batch)
    mem = llama_cpp.llama_get_memory(llm._ctx.ctx)
    run["seq_pos_max"] = llama_cpp.llama_memory_seq_pos_max(mem, seq)
    out["runs"].append(run)
    M.mtmd_input_chunks_free(chunks)
    M.mtmd_bitmap_free(bitmap)
M.mtmd_free(ctx)
print(json.dumps(out))
"""


def noise_png(path: Path, seed: int) -> Path:
    path.write_bytes(imageutil.noise(seed))
    return path


def run_script(*args: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, args)],
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_projector_loads_tokenizes_and_evaluates_into_a_sequence(
    tmp_path: Path, model_factory: Callable[..., Path]
) -> None:
    model = model_factory("llama", **ggufgen.VISION_CHAT)
    proj = model_factory("mmproj", **ggufgen.TINY_MMPROJ)
    a, b = noise_png(tmp_path / "a.png", 1), noise_png(tmp_path / "b.png", 2)
    out = run_script(model, proj, a, b)
    assert out["loaded"] and not out["non_causal"] and not out["mrope"]
    n_image = ggufgen.mmproj_tokens(ggufgen.TINY_MMPROJ)
    for seq, (run, image) in enumerate(zip(out["runs"], (a, b), strict=True)):
        assert run["tokenize"] == 0
        kinds = [c["type"] for c in run["chunks"]]
        assert kinds == [0, 1, 0]  # text, the image, text
        image_chunk = run["chunks"][1]
        assert image_chunk["n_tokens"] == image_chunk["n_pos"] == n_image
        assert run["encode"] == 0
        assert all(c["decode"] == 0 for c in run["chunks"])
        # the id is the SHA-256 of the file's bytes: what modeld's cache keys use
        assert run["id"] == hashlib.sha256(image.read_bytes()).hexdigest()
        # every position went into this sequence
        assert run["seq_pos_max"] == sum(c["n_tokens"] for c in run["chunks"]) - 1, seq
    # the image reaches the model: another image, another next token after the same text
    assert out["runs"][0]["argmax"] != out["runs"][1]["argmax"]


def test_projector_of_another_width_is_refused(
    tmp_path: Path, model_factory: Callable[..., Path]
) -> None:
    model = model_factory("llama", **ggufgen.TINY_CHAT)
    wrong = model_factory("mmproj", **dict(ggufgen.TINY_MMPROJ, n_embd_text=32))
    assert run_script(model, wrong, noise_png(tmp_path / "a.png", 1)) == {"loaded": False}


#: A child's setup for the scripts below: images A and B, a loaded Vision and its prompt parts
VISION_SETUP = r"""
import hashlib, json, sys
import llama_cpp
from modeld.errors import InvalidRequestError
from modeld.model import memory
from modeld.runner.vision import Vision, placeholder

model, proj, a, b = sys.argv[1:]
A, B = open(a, "rb").read(), open(b, "rb").read()
llm = llama_cpp.Llama(model, n_ctx=512, n_batch=128, flash_attn=True, verbose=False,
                      n_threads=1)
vision = Vision.open(proj, llm, 1)
parts = ["<|im_start|>user\n", " and ", " here?<|im_end|>\n"]
"""


def run_vision(script: str, tmp_path: Path,
               model_factory: Callable[..., Path]) -> tuple[dict[str, Any], Path, Path]:
    """Run ``script`` after :data:`VISION_SETUP` in a child with the vision test model, its
    projector and two images; its last line of output (JSON), and the images."""
    model = model_factory("llama", **ggufgen.VISION_CHAT)
    proj = model_factory("mmproj", **ggufgen.TINY_MMPROJ)
    a, b = noise_png(tmp_path / "a.png", 1), noise_png(tmp_path / "b.png", 2)
    args = [sys.executable, "-c", VISION_SETUP + script, *map(str, (model, proj, a, b))]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out, a, b


KEPT_SCRIPT = r"""
out = {}
def tokens(datas):
    done = vision.tokenize(parts[:len(datas) + 1], datas, True)
    for image in done.images:
        image.free()
    return done.tokens
out["first"] = tokens([A, B])
out["kept_after_first"] = len(vision._bitmaps)
out["again"] = tokens([A, B])  # both from the kept bitmaps
out["twice"] = tokens([A, A])  # one image twice in one request: kept once
out["kept_after_twice"] = sorted(vision._bitmaps)
out["placeholder_a"] = placeholder(hashlib.sha256(A).hexdigest())
memory.KEPT_BITMAP_BYTES = 40 * 40 * 3  # room for one image
out["small"] = tokens([B, A])
out["kept_small"] = sorted(vision._bitmaps)
vision.close()
print(json.dumps(out))
"""


def test_decoded_images_are_kept_for_the_next_request_within_their_bound(
    tmp_path: Path, model_factory: Callable[..., Path]
) -> None:
    """An image sent again (agents resend their screenshot every turn) is not decoded again:
    the runner keeps decoded images by SHA-256 up to memory.KEPT_BITMAP_BYTES, and the
    prompt's tokens are the same either way."""
    out, a, b = run_vision(KEPT_SCRIPT, tmp_path, model_factory)
    ids = sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b))
    assert out["kept_after_first"] == 2 and out["kept_after_twice"] == ids
    assert out["again"] == out["first"]
    n_image = ggufgen.mmproj_tokens(ggufgen.TINY_MMPROJ)
    assert out["twice"].count(out["placeholder_a"]) == 2 * n_image
    # room for one 40x40 image: the newest stays, the older is freed
    assert out["kept_small"] == [hashlib.sha256(a.read_bytes()).hexdigest()]
    assert out["small"] != out["first"]  # B before A: other placeholders in the other order


ENCODED_SCRIPT = r"""
def image(data):
    (one,) = vision.tokenize(parts[::2], [data], True).images
    return one
out = {}
freed = image(A)
freed.free()
try:
    vision.embeddings(freed)
    out["failed"] = None
except InvalidRequestError as exc:
    out["failed"] = exc.message
out["kept_after_failure"] = len(vision._encoded)
first = image(A)
rows = vision.embeddings(first)
out["shape"] = list(rows.shape)
out["chunk_freed"] = first.chunk is None
first.free()  # again (Stream.release does): a no-op, not a second mtmd free
again = image(A)
out["reused"] = vision.embeddings(again) is rows
out["unused_chunk_kept"] = again.chunk is not None  # the owner frees it (Stream.release)
again.free()
memory.KEPT_IMAGES = 1
other = image(B)
vision.embeddings(other)
out["kept"] = list(vision._encoded)
out["ids"] = [hashlib.sha256(A).hexdigest(), hashlib.sha256(B).hexdigest()]
vision.close()
print(json.dumps(out))
"""


def test_embeddings_are_encoded_once_kept_within_their_bound_and_failures_raise(
    tmp_path: Path, model_factory: Callable[..., Path]
) -> None:
    """Vision.embeddings on the batch loop's thread: the array itself (an image encoded for an
    earlier request is not encoded again, up to memory.KEPT_IMAGES), its chunk freed once;
    a failure raises for its request to end with and keeps nothing."""
    out, _, _ = run_vision(ENCODED_SCRIPT, tmp_path, model_factory)
    assert out["failed"] == "the image was released before it was encoded"
    assert out["kept_after_failure"] == 0
    n_embd = ggufgen.VISION_CHAT["n_embd"]
    assert out["shape"] == [ggufgen.mmproj_tokens(ggufgen.TINY_MMPROJ), n_embd]
    assert out["chunk_freed"] is True
    assert out["reused"] is True and out["unused_chunk_kept"] is True
    assert out["kept"] == out["ids"][1:]  # room for one: the newest

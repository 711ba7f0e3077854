"""Images (issue 38): a 1-image question, modeld against ``llama-server --mmproj`` on the same
generated pair, and the turn after it that sends the same image again (an agent resends its
screenshot every turn).

The pair: a generated llama (8 layers, 512 wide, f16, ChatML, its markers one token each) and
an ``mlp`` projector made for it (a 6-block ViT 256 wide over 14-pixel patches of a 224-pixel
square: 256 image tokens), both from tests/ggufgen.py. Each round sends a new image (random
pixels, a 224-pixel PNG, so nothing is cached from an earlier round) to both servers,
alternating which goes first, over ``/v1/chat/completions``: turn 1 asks about it; turn 2 is
the same conversation plus a short fixed reply and a short new question. Time to first token
is the wall time of a non-streamed request for one token (greedy): the same measure on both
sides, with no difference in how the first chunk of a stream is sent. Targets: turn 1 ≤ 1.0 ×
llama-server's; turn 2 ≤ 0.2 × turn 1.
"""

from __future__ import annotations

import base64
import io
import json
import time
from typing import Any

import peer
from b_http import _post
from harness import Context, daemon, free_port, generated, interleave, summary, target

#: ChatML's markers are one token each, as in a real ChatML model's vocabulary.
TEXT: dict[str, Any] = dict(n_layer=8, n_embd=512, n_head=8, n_ff=1408, n_vocab=4096,
                            context_length=4096, dtype="f16",
                            specials=("<|im_start|>", "<|im_end|>"))  # fmt: skip
PROJECTOR: dict[str, Any] = dict(n_embd_text=512, n_layer=6, n_embd=256, n_head=4, n_ff=1024,
                                 n_hidden=1024, image_size=224, patch_size=14)  # fmt: skip
N_CTX = 4096
#: Turn 2's text. The generated vocabulary spells words nearly a character a token, so these
#: are short: about the tokens a real tokenizer makes of a sentence each.
REPLY = "Noise."
QUESTION = "Colours?"


def _pair(smoke: bool) -> tuple[Any, Any, dict[str, Any]]:
    import ggufgen  # type: ignore[import-not-found]

    if smoke:
        text, proj = dict(ggufgen.VISION_CHAT), dict(ggufgen.TINY_MMPROJ)
    else:
        text, proj = dict(TEXT, chat_template=ggufgen.CHATML_TEMPLATE), PROJECTOR
    return generated("llama", **text), generated("mmproj", **proj), {
        "text": {k: v for k, v in text.items() if k != "chat_template"}, "projector": proj,
        "image_tokens": ggufgen.mmproj_tokens(proj)}


def _image(seed: int, size: int) -> str:
    """A ``size`` square of random colours as a PNG data URI."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _messages(uri: str, turn: int) -> list[dict[str, Any]]:
    first = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": uri}},
        {"type": "text", "text": "What is in this picture?"}]}]
    if turn == 1:
        return first
    return [*first, {"role": "assistant", "content": REPLY},
            {"role": "user", "content": QUESTION}]


def _ask(port: int, model: str, uri: str, turn: int, usage: list[dict[str, Any]]) -> float:
    """Seconds for a greedy one-token answer (the request sent to the reply read)."""
    body = {"model": model, "messages": _messages(uri, turn), "max_tokens": 1,
            "temperature": 0.0, "stream": False}  # fmt: skip
    t0 = time.perf_counter()
    doc = json.loads(_post(port, "/v1/chat/completions", body).read())
    seconds = time.perf_counter() - t0
    usage.append(doc.get("usage") or {})
    return seconds


def vision(ctx: Context) -> dict[str, Any]:
    model, proj, pair = _pair(ctx.smoke)
    size = pair["projector"].get("image_size", 32)
    port = free_port()
    ours = str(model)
    usage: dict[str, list[dict[str, Any]]] = {"modeld": [], "llama_server": []}
    with daemon(env={"MODELD_HTTP": f"127.0.0.1:{port}"}) as d:
        d.client(timeout=600).load(ours, n_ctx=N_CTX, parallel=1, keep_alive="1h",
                                   mmproj=str(proj))  # fmt: skip
        with peer.server("-m", str(model), "--mmproj", str(proj), "-c", str(N_CTX),
                         "--parallel", "1", "-t", str(ctx.threads)) as srv:
            theirs_port = int(srv.url.rsplit(":", 1)[1])
            theirs = str(srv.get("/v1/models")["data"][0]["id"])  # type: ignore[index]
            seeds = iter(range(1_000_000))

            def turns(p: int, name: str, key: str, times: dict[str, list[float]]) -> float:
                uri = _image(next(seeds), size)  # a new image: nothing cached from before
                first = _ask(p, name, uri, 1, usage[key])
                times.setdefault(key, []).append(_ask(p, name, uri, 2, usage[key]))
                return first

            warm: dict[str, list[float]] = {}
            for _ in range(2):  # both warm: first-use costs paid
                turns(port, ours, "modeld", warm)
                turns(theirs_port, theirs, "llama_server", warm)
            for u in usage.values():
                u.clear()
            second: dict[str, list[float]] = {}
            first = interleave(
                {"modeld": lambda: turns(port, ours, "modeld", second),
                 "llama_server": lambda: turns(theirs_port, theirs, "llama_server", second)},
                ctx.rounds)  # fmt: skip
    m1, p1 = summary(first["modeld"]), summary(first["llama_server"])
    m2, p2 = summary(second["modeld"]), summary(second["llama_server"])
    ratio = m1["median"] / p1["median"] if m1["median"] and p1["median"] else None
    repeat = m2["median"] / m1["median"] if m1["median"] and m2["median"] else None
    peer_repeat = p2["median"] / p1["median"] if p1["median"] and p2["median"] else None
    return {
        "title": "Images: a 1-image question vs llama-server --mmproj",
        "what": (__doc__ or "").split("\n\n", 1)[1].replace("\n", " ").strip(),
        "pair": pair,
        "n_ctx": N_CTX,
        "threads": ctx.threads,
        "cpu_flags": peer.cpu_flags(),
        "modeld": {"first_s": m1, "repeat_s": m2, "usage_first": usage["modeld"][0::2][-1],
                   "usage_repeat": usage["modeld"][1::2][-1]},
        "llama_server": {"first_s": p1, "repeat_s": p2,
                         "usage_first": usage["llama_server"][0::2][-1],
                         "usage_repeat": usage["llama_server"][1::2][-1]},
        "ratio": ratio,
        "repeat_ratio": repeat,
        "peer_repeat_ratio": peer_repeat,
        "targets": [
            target("vision: 1-image time to first token / llama-server --mmproj's", ratio,
                   1.0, "<="),
            target("vision: the repeated-image turn / the first", repeat, 0.2, "<="),
        ],
    }

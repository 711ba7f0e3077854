"""Images in a real runner process (issue 38): a generated text model loaded with a generated
projector, images evaluated into each request's own sequence inside the batch loop, beside
text requests, reused from the prompt cache by their hash. Real llama-cpp-python and libmtmd,
real ZeroMQ.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ggufgen
import imageutil
from modeld.wire import runnerwire as rp
from test_runner import Harness
from test_runner_batch import _replies

pytestmark = pytest.mark.slow

N_IMAGE = ggufgen.mmproj_tokens(ggufgen.TINY_MMPROJ)
A, B = imageutil.b64(imageutil.noise(1)), imageutil.b64(imageutil.noise(2))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The vision test model and its projector."""
    root = Path(__file__).parent / ".models"
    return (ggufgen.cached_model(root, "llama", **ggufgen.VISION_CHAT),
            ggufgen.cached_model(root, "mmproj", **ggufgen.TINY_MMPROJ))  # fmt: skip


@pytest.fixture()
def runner() -> Iterator[Harness]:
    h = Harness("v1")
    yield h
    h.close()


def ask(image: str | None, text: str = "what is this?") -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "user", "content": text}
    if image is not None:
        msg["images"] = [image]
    return {"messages": [msg], "temperature": 0.0, "max_tokens": 12}


def run(h: Harness, rid: str, **kw: Any) -> tuple[str, dict[str, Any]]:
    h.send(rp.generate(rid, **kw))
    chunks, final = h.collect(rid)
    assert final["type"] == "done", final
    return "".join(chunks), final


def test_an_image_reaches_the_model_and_its_replies_are_reproducible(
    runner: Harness, pair: tuple[Path, Path]
) -> None:
    model, proj = pair
    loaded = runner.loaded(model, n_ctx=512, mmproj=str(proj))
    assert loaded["vision"] is True
    _, plain = run(runner, "t", **ask(None))
    text_a, first = run(runner, "a1", **ask(A))
    # the image's tokens are in the prompt
    assert first["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + N_IMAGE
    text_b, _ = run(runner, "b1", **ask(B))
    assert text_a != text_b  # another image, another greedy reply
    again, second = run(runner, "a2", **ask(A))
    assert again == text_a  # the same image: the same reply
    # ... and its prompt came from the prompt cache: the image was not evaluated again
    assert second["usage"]["prompt_tokens_reused"] == second["usage"]["prompt_tokens"]


def test_an_image_request_decodes_beside_text_requests(
    runner: Harness, pair: tuple[Path, Path]
) -> None:
    model, proj = pair
    runner.loaded(model, n_ctx=512, parallel=3, mmproj=str(proj))
    solo_a, _ = run(runner, "solo-a", **ask(A))
    solo_t, _ = run(runner, "solo-t", **dict(ask(None, "tell me a story"), max_tokens=400))
    runner.send(rp.generate("t", **dict(ask(None, "tell me a story"), max_tokens=400)))
    runner.send(rp.generate("a", **ask(A, "and this one?")))
    runner.send(rp.generate("a-same", **ask(A)))
    got = _replies(runner, ["t", "a", "a-same"])
    assert all(final["type"] == "done" for _, final, _ in got.values()), got
    assert got["t"][0] == solo_t  # greedy replies do not depend on the batch
    assert got["a-same"][0] == solo_a
    assert got["t"][1]["timings"]["batched_max"] >= 2  # the text reply shared its steps
    order = got["t"][2]
    assert order[-1] == "t"  # the image requests ended while the story went on


@pytest.mark.parametrize("fmt", ["JPEG", "GIF", "WEBP"])
def test_other_formats(runner: Harness, pair: tuple[Path, Path], fmt: str) -> None:
    model, proj = pair
    runner.loaded(model, n_ctx=512, mmproj=str(proj))
    image = imageutil.b64(imageutil.noise(3, fmt=fmt))
    _, plain = run(runner, "t", **ask(None))
    _, done = run(runner, "i", **ask(image))
    assert done["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + N_IMAGE


def test_a_prompt_with_images_before_it_and_a_raw_prompt(
    runner: Harness, pair: tuple[Path, Path]
) -> None:
    model, proj = pair
    runner.loaded(model, n_ctx=512, mmproj=str(proj))
    _, one = run(runner, "p1", prompt="compare", images=[A], max_tokens=4, temperature=0.0)
    _, two = run(runner, "p2", prompt="compare", images=[A, B], max_tokens=4, temperature=0.0)
    assert two["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"] + N_IMAGE
    _, raw = run(runner, "r", prompt="x", raw=True, images=[A], max_tokens=4, temperature=0.0)
    assert raw["usage"]["prompt_tokens"] > N_IMAGE


def test_bad_images_and_text_only_models_fail_one_request(
    runner: Harness, pair: tuple[Path, Path], tiny_chat_model: Path
) -> None:
    model, proj = pair
    runner.loaded(model, n_ctx=512, mmproj=str(proj))
    broken = imageutil.b64(imageutil.noise(4)[:60])  # a PNG header, then nothing
    runner.send(rp.generate("bad", **ask(broken)))
    _, final = runner.collect("bad")
    assert final["type"] == "error" and "could not be" in final["message"], final
    run(runner, "ok", **ask(A))  # the runner goes on
    runner.loaded(tiny_chat_model, n_ctx=512)  # no projector
    runner.send(rp.generate("blind", **ask(A)))
    _, final = runner.collect("blind")
    assert final["type"] == "error" and "mmproj" in final["message"], final


def test_a_projector_of_another_model_is_refused_at_load(
    runner: Harness, pair: tuple[Path, Path], model_factory: Callable[..., Path]
) -> None:
    model, _ = pair
    wrong = model_factory("mmproj", **dict(ggufgen.TINY_MMPROJ, n_embd_text=32))
    reply = runner.load(model, n_ctx=512, mmproj=str(wrong))
    assert reply["type"] == "load_failed", reply
    assert "does not fit" in reply["message"] and "n_embd" in reply["message"], reply

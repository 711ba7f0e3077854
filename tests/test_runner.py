"""The runner process, driven the way the daemon drives it: a real ``python -m modeld.runner``
subprocess connected to a ROUTER bound here, real llama-cpp-python, real ZeroMQ.

Native work (loading models, malformed files) happens only in the runner subprocess, so a
llama.cpp abort fails a test instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

import ggufgen
from modeld.runner import chat, specs
from modeld.wire import runnerwire as rp

REPLY_TIMEOUT_S = 60.0  # generous: the machine is shared; this only bounds a hang


class Harness:
    """A ROUTER bound on a fresh ipc path plus one runner process connected to it."""

    def __init__(self, runner_id: str = "r1", spawn: bool = True) -> None:
        self.dir = tempfile.mkdtemp(prefix="mdrun-")
        self.endpoint = f"ipc://{self.dir}/runners.sock"
        self.runner_id = runner_id
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)
        self.log_path = Path(self.dir) / "runner.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.hello: dict[str, Any] = {}
        self.heartbeats = 0
        if spawn:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "modeld.runner",
                        "--endpoint",
                        self.endpoint,
                        "--id",
                        runner_id,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            self.hello = self.recv()

    @property
    def pid(self) -> int:
        return int(self.hello["pid"])

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.send_multipart([self.runner_id.encode(), *rp.encode(msg)])

    def send_raw(self, frame: bytes) -> None:
        self.sock.send_multipart([self.runner_id.encode(), frame])

    def recv(self, timeout_s: float = REPLY_TIMEOUT_S) -> dict[str, Any]:
        """The runner's next message; its heartbeats (own socket, every second) are counted."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(0.0, deadline - time.monotonic())
            if not self.sock.poll(int(left * 1000)):
                raise AssertionError(f"no reply from the runner; log:\n{self.log_tail()}")
            ident, *frames = self.sock.recv_multipart()
            if ident == rp.heartbeat_identity(self.runner_id).encode():
                assert rp.decode(frames) == rp.heartbeat()
                self.heartbeats += 1
                continue
            assert ident == self.runner_id.encode()
            return rp.decode(frames)

    def load(self, path: Path | str, n_ctx: int = 512, **kw: Any) -> dict[str, Any]:
        kw.setdefault("n_threads", 1)  # shared 2-core machines: no thread-barrier thrash
        kw.setdefault("seed", 1)
        self.send(rp.load(path, n_ctx=n_ctx, **kw))
        return self.recv()

    def loaded(self, path: Path | str, n_ctx: int = 512, **kw: Any) -> dict[str, Any]:
        reply = self.load(path, n_ctx, **kw)
        assert reply["type"] == "loaded", reply
        return reply

    def collect(self, rid: str) -> tuple[list[str], dict[str, Any]]:
        """Chunks of request ``rid`` and its final done/error message."""
        chunks: list[str] = []
        while True:
            msg = self.recv()
            assert msg.get("rid") == rid, msg
            if msg["type"] == "chunk":
                chunks.append(msg["text"])
                continue
            assert msg["type"] in ("done", "error"), msg
            return chunks, msg

    def generate(self, rid: str, **kw: Any) -> tuple[str, dict[str, Any]]:
        self.send(rp.generate(rid, **kw))
        chunks, final = self.collect(rid)
        return "".join(chunks), final

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with _suppress():
                self.send(rp.shutdown())
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.sock.close(0)
        self.ctx.term()
        shutil.rmtree(self.dir, ignore_errors=True)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()


@pytest.fixture(scope="module")
def gemma(default_model: Path) -> Iterator[tuple[Harness, dict[str, Any]]]:
    h = Harness("g1")
    loaded = h.loaded(default_model, n_ctx=1024)
    yield h, loaded
    h.close()


# --------------------------------------------------------------------------- hello and load


def test_hello_reports_pid_and_memory_baseline(harness: Harness) -> None:
    assert harness.hello["type"] == "hello"
    assert harness.proc is not None
    assert harness.hello["pid"] == harness.proc.pid
    baseline = harness.hello["baseline"]
    assert baseline["rss"] > 10 * 2**20  # Python + llama_cpp imported
    assert baseline["rss"] >= baseline["anon"]


def test_load_reports_context_timings_and_footprint(harness: Harness, tiny_model: Path) -> None:
    loaded = harness.loaded(tiny_model, n_ctx=512)
    assert loaded["n_ctx"] == 512
    assert loaded["n_ctx_train"] == 2048
    assert loaded["chat_format"] == chat.PLAIN  # llama arch, no template
    assert loaded["load_s"] > 0 and loaded["warmup_s"] > 0
    assert set(loaded["footprint"]) >= {"rss", "anon", "file"}
    assert loaded["memory"]["rss"] >= harness.hello["baseline"]["rss"] - 2**20
    harness.send(rp.memory_request())
    mem = harness.recv()
    assert mem["type"] == "memory" and mem["memory"]["rss"] > 0
    cold = harness.loaded(tiny_model, n_ctx=512, warm_up=False)  # a request is about to run
    assert cold["warmup_s"] < loaded["warmup_s"] and cold["warmup_s"] < 1e-3
    _, done = harness.generate("w1", prompt="the quick", raw=True, max_tokens=2,
                                  temperature=0.0)
    assert done["type"] == "done" and done["usage"]["completion_tokens"] == 2


def test_load_failures_are_reported_and_the_runner_survives(
    harness: Harness, tiny_model: Path, tmp_path: Path
) -> None:
    missing = harness.load(tmp_path / "nope.gguf")
    assert missing["type"] == "load_failed" and missing["code"] == "model_not_found"

    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a gguf file at all\n" * 100)
    bad = harness.load(garbage)
    assert bad["type"] == "load_failed" and bad["code"] == "invalid_model"
    assert str(garbage) in bad["message"] and "re-download" in bad["hint"]

    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(tiny_model.read_bytes()[: tiny_model.stat().st_size // 2])
    cut = harness.load(truncated)
    assert cut["type"] == "load_failed" and cut["code"] == "invalid_model"

    wrong_ctx = harness.load(tiny_model, n_ctx=300)  # not a multiple of 256
    assert wrong_ctx["type"] == "load_failed" and wrong_ctx["code"] == "invalid_request"

    assert harness.proc is not None and harness.proc.poll() is None
    assert harness.loaded(tiny_model)["n_ctx"] == 512


def test_bad_messages_get_error_replies(harness: Harness, tiny_model: Path) -> None:
    harness.send_raw(b"{not json")
    reply = harness.recv()
    assert reply["type"] == "error" and reply["code"] == "invalid_request"
    harness.send({"type": "frobnicate", "rid": "x1"})
    reply = harness.recv()
    assert reply["type"] == "error" and reply["rid"] == "x1"
    harness.loaded(tiny_model)
    harness.send({"type": "generate", "rid": "x2", "max_tokens": 4})  # no prompt
    reply = harness.recv()
    assert reply["type"] == "error" and reply["code"] == "invalid_request"
    harness.send(rp.embed("x3", ["hi"]))  # generate-mode model
    reply = harness.recv()
    assert reply["code"] == "invalid_request" and "generate mode" in reply["message"]


# --------------------------------------------------------------------------- generation


def test_raw_generation_streams_until_max_tokens(harness: Harness, tiny_model: Path) -> None:
    harness.loaded(tiny_model)
    harness.send(
        rp.generate("g1", prompt="the quick brown fox", raw=True, max_tokens=16, temperature=0.0)
    )
    chunks, done = harness.collect("g1")
    assert done["type"] == "done" and done["finish_reason"] == "length"
    assert done["usage"]["completion_tokens"] == 16
    assert 1 < len(chunks) <= 16  # streamed token by token, not in one piece
    assert done["usage"]["prompt_tokens"] > 4
    timings = done["timings"]
    assert timings["prompt_eval_s"] >= 0 and timings["generation_s"] > 0
    assert timings["tokens_per_s"] > 0
    assert done["memory"]["rss"] >= done["memory"]["anon"] > 0  # measured after the request


def test_a_reply_read_whole_comes_in_fewer_chunks(
    harness: Harness, model_factory: Callable[..., Path]
) -> None:
    """``stream`` false: the same text, sent once a second at most (the first piece at once,
    the rest with the done) instead of every 40 ms: nobody reads the pieces meanwhile. A model
    slow enough (a few ms a token) that 200 tokens span several 40 ms intervals."""
    model = model_factory("llama", n_layer=4, n_embd=512, n_head=8, n_ff=1408, n_vocab=32000,
                          context_length=2048, dtype="f32", seed=3)  # fmt: skip
    harness.loaded(model)
    opts: dict[str, Any] = dict(prompt="once upon a time", raw=True, max_tokens=200,
                                temperature=0.0)  # fmt: skip
    harness.send(rp.generate("w1", stream=False, **opts))
    whole, done = harness.collect("w1")
    harness.send(rp.generate("w2", **opts))
    streamed, sdone = harness.collect("w2")
    assert "".join(whole) == "".join(streamed)
    assert done["usage"]["completion_tokens"] == sdone["usage"]["completion_tokens"] > 0
    assert len(whole) <= 2 + int(done["timings"]["generation_s"] / specs.QUIET_INTERVAL_S)
    if sdone["timings"]["generation_s"] > 10 * specs.CHUNK_INTERVAL_S:
        assert len(streamed) > len(whole)  # the streamed one really came in pieces


def test_same_seed_gives_same_text(harness: Harness, tiny_model: Path) -> None:
    harness.loaded(tiny_model)
    opts: dict[str, Any] = dict(
        prompt="once upon a time", raw=True, max_tokens=24, temperature=1.0, top_k=0, top_p=1.0
    )
    a, _ = harness.generate("s1", seed=7, **opts)
    b, _ = harness.generate("s2", seed=7, **opts)
    c, _ = harness.generate("s3", seed=8, **opts)
    assert a == b
    assert a != c


def test_greedy_repeat_is_an_exact_prompt_cache_hit(harness: Harness, tiny_model: Path) -> None:
    harness.loaded(tiny_model)
    prompt = "alpha beta gamma delta epsilon zeta eta theta"
    opts: dict[str, Any] = dict(prompt=prompt, raw=True, max_tokens=8, temperature=0.0)
    text, first = harness.generate("p1", **opts)
    n = first["usage"]["prompt_tokens"]
    assert first["usage"]["prompt_tokens_reused"] == 0  # nothing cached after the load
    again_text, again = harness.generate("p2", **opts)
    # The state saved after the first evaluation: nothing evaluated, same reply.
    assert again["usage"]["prompt_tokens_reused"] == n
    assert again_text == text


def test_sampled_requests_reuse_the_longest_prefix(harness: Harness, tiny_model: Path) -> None:
    harness.loaded(tiny_model, prompt_cache_mib=0)
    prompt = "alpha beta gamma delta epsilon zeta eta theta"
    opts: dict[str, Any] = dict(raw=True, max_tokens=4, temperature=1.0, seed=3)
    _, first = harness.generate("q1", prompt=prompt, **opts)
    n = first["usage"]["prompt_tokens"]
    _, again = harness.generate("q2", prompt=prompt, **opts)
    # Everything but the last prompt token is reused (it is re-evaluated to get fresh logits).
    assert again["usage"]["prompt_tokens_reused"] == n - 1
    _, longer = harness.generate("q3", prompt=prompt + " iota kappa", **opts)
    assert longer["usage"]["prompt_tokens_reused"] >= n - 1
    assert longer["usage"]["prompt_tokens"] > n


def test_greedy_requests_reuse_only_aligned_stable_pieces(
    harness: Harness, tiny_model: Path
) -> None:
    from modeld.runner.promptplan import ALIGN

    harness.loaded(tiny_model, prompt_cache_mib=0)
    base = " ".join(f"w{i}" for i in range(150))
    opts: dict[str, Any] = dict(raw=True, max_tokens=4, temperature=0.0)
    text, first = harness.generate("g1", prompt=base, **opts)
    n = first["usage"]["prompt_tokens"]
    assert n > 2 * ALIGN
    # Without the prompt cache a repeat reuses the stable pieces before the last one only.
    again_text, again = harness.generate("g2", prompt=base, **opts)
    assert again["usage"]["prompt_tokens_reused"] == ALIGN * ((n - 1) // ALIGN)
    assert again_text == text
    # A sampled request after it may reuse more (longest prefix), a greedy one no more.
    _, sampled = harness.generate("g3", prompt=base, raw=True, max_tokens=2, temperature=1.0)
    assert sampled["usage"]["prompt_tokens_reused"] == n - 1
    third_text, third = harness.generate("g4", prompt=base, **opts)
    assert third["usage"]["prompt_tokens_reused"] == ALIGN * ((n - 1) // ALIGN)
    assert third_text == text


def test_stop_strings_end_generation_without_the_stop_text(
    harness: Harness, tiny_model: Path
) -> None:
    harness.loaded(tiny_model)
    opts: dict[str, Any] = dict(prompt="hello there", raw=True, max_tokens=40, temperature=0.0)
    full, done = harness.generate("t1", **opts)
    assert done["finish_reason"] == "length" and len(full) > 12
    stop = full[8:11]
    expected = full[: full.index(stop)]
    text, done = harness.generate("t2", stop=[stop], **opts)
    assert done["finish_reason"] == "stop"
    assert text == expected


def test_context_exceeded_is_reported_before_generating(harness: Harness, tiny_model: Path) -> None:
    harness.loaded(tiny_model, n_ctx=256)
    long_prompt = " ".join(["word"] * 400)
    chunks, reply = harness.generate("c1", prompt=long_prompt, raw=True, max_tokens=8)
    assert chunks == ""
    assert reply["type"] == "error" and reply["code"] == "context_exceeded"
    assert reply["details"]["n_ctx"] == 256
    assert reply["details"]["prompt_tokens"] >= 256
    assert "256" in reply["message"]


def test_generation_stops_at_the_end_of_the_context(harness: Harness, tiny_model: Path) -> None:
    harness.loaded(tiny_model, n_ctx=256)
    prompt = " ".join(["word"] * 50)  # about 200 tokens with the tiny vocabulary
    _, done = harness.generate("e1", prompt=prompt, raw=True, max_tokens=1000, temperature=0.0)
    assert done["type"] == "done" and done["finish_reason"] == "length", done
    usage = done["usage"]
    assert 150 < usage["prompt_tokens"] < 256
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 256


def test_chat_uses_the_gguf_template(harness: Harness, tiny_chat_model: Path) -> None:
    from modeld.runner.template import render_template

    loaded = harness.loaded(tiny_chat_model)
    assert loaded["chat_format"] == chat.TEMPLATE
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    via_chat, chat_done = harness.generate("m1", messages=messages, max_tokens=12, temperature=0.0)
    rendered = chat.format_messages(
        messages, chat.TEMPLATE, template=_template_of(), render=render_template
    ).text
    assert rendered.startswith("<|im_start|>system\nbe brief<|im_end|>")
    via_raw, raw_done = harness.generate(
        "m2", prompt=rendered, raw=True, max_tokens=12, temperature=0.0
    )
    assert chat_done["usage"]["prompt_tokens"] == raw_done["usage"]["prompt_tokens"]
    assert via_chat == via_raw


def _template_of() -> str:
    import ggufgen

    return str(ggufgen.CHATML_TEMPLATE)


def test_cancel_queued_before_generation_starts(harness: Harness, tiny_model: Path) -> None:
    harness.loaded(tiny_model, n_ctx=2048)
    os.kill(harness.pid, signal.SIGSTOP)  # both messages are waiting when it resumes
    try:
        harness.send(
            rp.generate("k1", prompt="cancel me", raw=True, max_tokens=1500, temperature=1.0)
        )
        harness.send(rp.cancel("k1"))
    finally:
        os.kill(harness.pid, signal.SIGCONT)
    chunks, reply = harness.collect("k1")
    assert reply["type"] == "error" and reply["code"] == "cancelled"
    assert len(chunks) <= 1
    assert reply["details"]["completion_tokens"] <= 1
    # The runner is still serving afterwards.
    _, done = harness.generate("k2", prompt="still here", raw=True, max_tokens=2)
    assert done["type"] == "done"


def test_requests_sent_back_to_back_are_served_in_order(harness: Harness, tiny_model: Path) -> None:
    """The daemon should wait for done, but a runner must not lose or mix early requests; a
    memory query during a generation is answered at once, between tokens."""
    harness.loaded(tiny_model)
    harness.send(rp.generate("q1", prompt="first", raw=True, max_tokens=60, temperature=0.0))
    harness.send(rp.memory_request())
    harness.send(rp.generate("q2", prompt="second", raw=True, max_tokens=3, temperature=0.0))
    order: list[tuple[str, str | None]] = []
    while len([o for o in order if o[0] == "done"]) < 2:
        msg = harness.recv()
        if msg["type"] != "chunk":
            order.append((msg["type"], msg.get("rid")))
    assert order.index(("done", "q1")) < order.index(("done", "q2"))
    assert ("memory", None) in order
    assert order.index(("memory", None)) < order.index(("done", "q2"))


# --------------------------------------------------------------------------- embeddings


def test_embed_mode_returns_one_normalized_vector_per_input(
    harness: Harness, tiny_model: Path
) -> None:
    loaded = harness.loaded(tiny_model, mode="embed")
    assert loaded["mode"] == "embed"
    harness.send(rp.embed("v1", ["hello world", "something else", "hello world"]))
    reply = harness.recv()
    assert reply["type"] == "done" and reply["rid"] == "v1"
    vecs = reply["embeddings"]
    assert len(vecs) == 3 and all(len(v) == 64 for v in vecs)  # n_embd of the tiny model
    for v in vecs:
        assert abs(sum(x * x for x in v) - 1.0) < 1e-4
    assert vecs[0] == pytest.approx(vecs[2], abs=1e-5)
    assert vecs[0] != pytest.approx(vecs[1], abs=1e-3)
    assert reply["usage"]["prompt_tokens"] > 3
    _, gen = harness.generate("v2", prompt="x", raw=True, max_tokens=2)
    assert gen["type"] == "error" and gen["code"] == "invalid_request"


def test_chunked_embedding_matches_a_single_pass(harness: Harness, tiny_model: Path) -> None:
    """Models without pooling are embedded in chunks with the KV cache carrying the prefix (to
    bound llama.cpp's per-token logits buffer); the result must equal one Llama.embed pass,
    computed here in a separate process."""
    text = "the quick brown fox jumps over the lazy dog " * 8  # several 64-token chunks
    harness.loaded(tiny_model, n_ctx=512, mode="embed")
    harness.send(rp.embed("w1", [text]))
    reply = harness.recv()
    assert reply["type"] == "done", reply
    assert reply["usage"]["prompt_tokens"] > 2 * 64
    script = textwrap.dedent(
        f"""
        import json, math, llama_cpp
        llm = llama_cpp.Llama({str(tiny_model)!r}, n_ctx=512, n_batch=512, n_ubatch=512,
                              embedding=True, flash_attn=True, swa_full=False, seed=1,
                              verbose=False)
        rows = llm.embed({text!r}, truncate=False)
        mean = [sum(c) / len(rows) for c in zip(*rows)]
        norm = math.sqrt(sum(x * x for x in mean))
        print(json.dumps([x / norm for x in mean]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    single_pass = json.loads(out.stdout.strip().splitlines()[-1])
    assert reply["embeddings"][0] == pytest.approx(single_pass, abs=1e-4)


def test_embedding_input_longer_than_the_context_is_an_error(
    harness: Harness, tiny_model: Path
) -> None:
    harness.loaded(tiny_model, n_ctx=256, mode="embed")
    harness.send(rp.embed("w2", ["short", "word " * 300]))
    reply = harness.recv()
    assert reply["type"] == "error" and reply["code"] == "context_exceeded"
    assert reply["details"]["n_ctx"] == 256


# --------------------------------------------------------------------------- the default model


def test_default_model_loads_with_its_footprint_and_qa_format(
    gemma: tuple[Harness, dict[str, Any]],
) -> None:
    _, loaded = gemma
    # No template in the file (so not llama-2), and a base model (so not Gemma's turn markers).
    assert loaded["chat_format"] == chat.QA
    assert loaded["n_ctx"] == 1024 and loaded["n_ctx_train"] == 32768
    # Weights are file-backed pages (~241 MiB file); KV and buffers are anonymous.
    assert loaded["footprint"]["file"] > 150 * 2**20
    assert loaded["footprint"]["anon"] > 0


def test_default_model_chat_is_question_answer_with_system_first(
    gemma: tuple[Harness, dict[str, Any]],
) -> None:
    h, _ = gemma
    messages = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What colour is the sky?"},
    ]
    expected_prompt = "Answer in one word.\n\nQuestion: What colour is the sky?\nAnswer:"
    via_chat, chat_done = h.generate("d1", messages=messages, max_tokens=8, temperature=0.0)
    via_raw, raw_done = h.generate(
        "d2", prompt=expected_prompt, raw=True, max_tokens=8, temperature=0.0
    )
    assert chat_done["usage"]["prompt_tokens"] == raw_done["usage"]["prompt_tokens"]
    # Same tokens; chat mode drops the leading space and stops at "\nQuestion:"; raw does not.
    assert via_chat and via_raw.lstrip().startswith(via_chat)
    assert "\nQuestion:" not in via_chat
    # Same conversation again: the prompt cache holds its state, nothing is evaluated.
    _, again = h.generate("d3", messages=messages, max_tokens=4, temperature=0.0)
    assert again["usage"]["prompt_tokens_reused"] == again["usage"]["prompt_tokens"]


def test_cancel_mid_generation_stops_within_one_token(
    gemma: tuple[Harness, dict[str, Any]],
) -> None:
    h, _ = gemma
    h.send(
        rp.generate(
            "c1",
            prompt="Tell me a long story about a dragon.",
            raw=True,
            max_tokens=400,
            temperature=0.0,
        )
    )
    before = 0  # completion tokens streamed so far (a chunk may carry several)
    while before < 3:
        msg = h.recv()
        assert msg["type"] == "chunk", msg
        before = msg["tokens"]
    os.kill(h.pid, signal.SIGSTOP)  # freeze it, collect what is already on the way
    try:
        while h.sock.poll(300):
            msg = h.recv()
            assert msg["type"] == "chunk", msg
            before = msg["tokens"]
        h.send(rp.cancel("c1"))
    finally:
        os.kill(h.pid, signal.SIGCONT)
    after, reply = h.collect("c1")
    assert reply["type"] == "error" and reply["code"] == "cancelled"
    # At most the token being decoded when it was frozen, plus one chunk that may have been
    # still inside its ZeroMQ I/O thread at that moment.
    assert len(after) <= 2
    assert reply["details"]["completion_tokens"] <= before + 2 < 400


# --------------------------------------------------------------------------- lifetime


def test_shutdown_exits_cleanly() -> None:
    h = Harness("s1")
    try:
        h.send(rp.shutdown())
        assert h.proc is not None and h.proc.wait(20) == 0
    finally:
        h.close()


def test_runner_exits_when_its_parent_dies() -> None:
    h = Harness("o1", spawn=False)
    parent_code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-m", "modeld.runner",
                          "--endpoint", {h.endpoint!r}, "--id", "o1"])
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    pid = 0
    try:
        hello = h.recv()
        pid = int(hello["pid"])
        assert _alive(pid)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 20
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the orphaned runner kept running"
    finally:
        if parent.poll() is None:
            parent.kill()
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
        h.close()


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its new parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("State:"):
                    return "Z" not in line.split()[1]
    except FileNotFoundError:
        return False
    return True


def test_each_request_frees_its_sampler(model_factory: Any) -> None:
    """A request's sampler chain holds n_vocab-sized buffers in a reference cycle: left to the
    garbage collector, a runner grew by megabytes per request (gemma: ~3 MiB each)."""
    big_vocab = model_factory("llama", **dict(ggufgen.TINY, n_vocab=600_000))
    h = Harness("s1")
    try:
        h.loaded(big_vocab, n_ctx=256, prompt_cache_mib=0)
        rss = []
        for i in range(12):
            _, done = h.generate(f"s{i}", prompt=f"tok{i} tok{i + 1}", raw=True, max_tokens=2)
            assert done["type"] == "done", done
            rss.append(done["memory"]["rss"])
        per_request = 600_000 * 12  # one llama_token_data array, the leak's unit
        growth = rss[-1] - rss[1]
        assert growth < 3 * per_request, f"runner grew {growth} bytes over 10 requests: {rss}"
    finally:
        h.close()

"""Rerank, the third model mode: a generated BERT cross-encoder (rank pooling, a classification
head) scored by a real runner, a real daemon, the CLI and the HTTP front door, and compared
with llama.cpp's own scores for the same pairs (llama-cpp-python in a separate process, one
pair per decode, as llama-server tokenizes them: ``[CLS] query [SEP] document [SEP]``)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cliutil import CliEnv
from daemonutil import rows, until
from modeld.errors import ContextExceededError, InvalidModelError
from modeld.wire import runnerwire as rp
from test_http import _answers, free_port
from test_runner import Harness

pytestmark = pytest.mark.slow

Factory = Callable[..., Any]
QUERY = "why is the sky blue?"
DOCS = ["the sky is blue", "a recipe for bread", "why is the sky blue?", "paris is the capital"]

_ORACLE = textwrap.dedent(
    """
    import json, sys
    import llama_cpp
    path, query, docs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    llm = llama_cpp.Llama(path, embedding=True, n_ctx=512, n_batch=512, n_ubatch=512,
                          flash_attn=True, verbose=False)
    assert llama_cpp.llama_pooling_type(llm._ctx.ctx) == llama_cpp.LLAMA_POOLING_TYPE_RANK
    cls, sep = 2, 3  # the generated vocabulary's [CLS] and [SEP]
    scores = []
    for doc in docs:
        tokens = [cls, *llm.tokenize(query.encode(), add_bos=False), sep,
                  *llm.tokenize(doc.encode(), add_bos=False), sep]
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm._ctx.ctx), True)
        llm._batch.set_batch(tokens, 0, True)
        llm._ctx.decode(llm._batch)
        scores.append(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)[0])
    print(json.dumps(scores))
    """
)


@pytest.fixture(scope="session")
def oracle_scores(reranker: Path) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", _ORACLE, str(reranker), QUERY, json.dumps(DOCS)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    scores: list[float] = json.loads(out.stdout.strip().splitlines()[-1])
    return scores


@pytest.fixture()
def runner() -> Iterator[Harness]:
    h = Harness("rr1")
    yield h
    h.close()


def _scores(results: list[dict[str, Any]]) -> list[float]:
    return [r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])]


# --------------------------------------------------------------------------- the runner


def test_runner_scores_equal_llama_cpp_and_are_deterministic(
    runner: Harness, reranker: Path, oracle_scores: list[float]
) -> None:
    loaded = runner.loaded(reranker, n_ctx=512, mode="rerank")
    assert loaded["mode"] == "rerank" and loaded["architecture"] == "bert"
    runner.send(rp.rerank("a", QUERY, DOCS))  # all pairs in one decode
    first = runner.recv()
    assert first["type"] == "done", first
    assert [r["index"] for r in first["results"]] == list(range(len(DOCS)))  # input order
    got = _scores(first["results"])
    assert all(math.isfinite(x) for x in got)
    assert max(got) - min(got) > 0.1  # the pairs score differently: an order mix-up shows
    assert got == pytest.approx(oracle_scores, rel=1e-4, abs=1e-5)
    runner.send(rp.rerank("b", QUERY, DOCS))
    assert _scores(runner.recv()["results"]) == got  # deterministic
    runner.send(rp.rerank("c", QUERY, DOCS[::-1]))
    assert _scores(runner.recv()["results"]) == pytest.approx(got[::-1], rel=1e-6)
    assert first["usage"]["prompt_tokens"] > 4 * len(DOCS)


def test_runner_top_n_and_context_limit(runner: Harness, reranker: Path) -> None:
    runner.loaded(reranker, n_ctx=512, mode="rerank")
    runner.send(rp.rerank("t", QUERY, DOCS, top_n=2))
    best = runner.recv()["results"]
    runner.send(rp.rerank("all", QUERY, DOCS))
    every = runner.recv()["results"]
    ranked = sorted(every, key=lambda r: -r["relevance_score"])
    assert best == ranked[:2]
    runner.send(rp.rerank("long", QUERY, ["the sky"] * 2 + ["blue " * 600]))
    reply = runner.recv()
    assert reply["type"] == "error" and reply["code"] == "context_exceeded", reply
    assert reply["details"]["document"] == 2 and reply["details"]["n_ctx"] == 512


def test_runner_loads_a_reranker_only_to_rerank(
    runner: Harness, reranker: Path, tiny_model: Path
) -> None:
    for path, mode in ((reranker, "generate"), (reranker, "embed"), (tiny_model, "rerank")):
        reply = runner.load(path, n_ctx=512, mode=mode)
        assert reply["type"] == "load_failed" and reply["code"] == "invalid_model", reply
    runner.loaded(reranker, n_ctx=512, mode="rerank")  # and it still serves


# --------------------------------------------------------------------------- the daemon


def test_daemon_reranks_and_says_what_kind_of_model_is_not_a_reranker(
    daemon_factory: Factory, reranker: Path, tiny_model: Path, oracle_scores: list[float]
) -> None:
    d = daemon_factory()
    c = d.client()
    reply = c.rerank(str(reranker), QUERY, DOCS)
    assert _scores(reply["results"]) == pytest.approx(oracle_scores, rel=1e-4, abs=1e-5)
    top = c.rerank(str(reranker), QUERY, DOCS, top_n=1)["results"]
    assert top == [max(reply["results"], key=lambda r: r["relevance_score"])]
    assert reply["timings"]["prompt_tokens"] > 0
    row = rows(c)[f"{reranker.name}#rerank"]
    assert row["mode"] == "rerank" and row["parallel"] == 1
    with pytest.raises(InvalidModelError) as not_reranker:
        c.rerank(str(tiny_model), QUERY, DOCS)
    assert "not a reranker" in not_reranker.value.message
    assert "text-generation model (architecture llama)" in not_reranker.value.message
    with pytest.raises(InvalidModelError) as generate:
        c.generate(str(reranker), "hello", max_tokens=2).text()
    assert "is a reranker" in generate.value.message and "modeld rerank" in generate.value.hint
    with pytest.raises(ContextExceededError):  # its training context is 512 tokens
        c.rerank(str(reranker), QUERY, ["blue " * 600])
    # a load or a show that names no mode takes the model's own: rerank
    assert c.load(str(reranker))["mode"] == "rerank"
    shown = c.show(str(reranker))
    assert shown["mode"] == "rerank" and shown["fits"] and shown["parallel"] == 1


def test_cli_rerank_text_json_stdin_and_exit_codes(reranker: Path, tiny_model: Path) -> None:
    with CliEnv.served() as cli:
        doc = cli.json("rerank", str(reranker), QUERY, *DOCS)
        assert doc["schema_version"] == 1 and doc["kind"] == "rerank"
        assert [r["index"] for r in doc["results"]] == list(range(len(DOCS)))
        best = max(doc["results"], key=lambda r: r["relevance_score"])
        top = cli.json("rerank", str(reranker), QUERY, "--top-n", "1", input="\n".join(DOCS))
        assert top["results"] == [best]  # documents one per line from stdin
        text = cli.run("rerank", str(reranker), QUERY, *DOCS, "--top-n", "2")
        assert text.returncode == 0, text.stderr
        lines = [line for line in text.stdout.splitlines() if line.strip()]
        assert lines[0].split() == ["INDEX", "SCORE", "DOCUMENT"]
        assert lines[2].split()[0] == str(best["index"]) and DOCS[best["index"]] in lines[2]
        wrong = cli.run("rerank", str(tiny_model), QUERY, "a", "b")
        assert wrong.returncode == 5, wrong.stderr  # INVALID_MODEL
        assert "not a reranker" in wrong.stderr
        empty = cli.run("rerank", str(reranker), QUERY)
        assert empty.returncode == 2 and "nothing to rerank" in empty.stderr


def test_http_rerank_has_llama_servers_shape(
    daemon_factory: Factory, reranker: Path, oracle_scores: list[float]
) -> None:
    port = free_port()  # the model named by its path: the owner allows paths over HTTP
    d = daemon_factory("--http", f"127.0.0.1:{port}", "--http-model-paths")
    until(lambda: _answers(port), timeout=30, what="the HTTP front door")
    body = {"model": str(reranker), "query": QUERY, "documents": DOCS, "top_n": 3}
    for route in ("/v1/rerank", "/rerank"):
        r = httpx.post(f"http://127.0.0.1:{port}{route}", json=body, timeout=60)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["object"] == "list" and doc["usage"]["prompt_tokens"] > 0
        scores = [x["relevance_score"] for x in doc["results"]]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True)  # best first
        for x in doc["results"]:
            assert x["relevance_score"] == pytest.approx(oracle_scores[x["index"]], rel=1e-4)
    r = httpx.post(f"http://127.0.0.1:{port}/v1/rerank",
                   json={"model": str(reranker), "query": QUERY, "documents": []}, timeout=60)
    assert r.status_code == 400 and "documents" in r.json()["error"]["message"]
    assert d.client().stats()["requests"] >= 2

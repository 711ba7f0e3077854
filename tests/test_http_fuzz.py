"""Property-based fuzzing of every HTTP route (issue 21): random JSON shapes and strings
(lone surrogates, NULs, huge numbers, wrong types), bodies that are not objects and bytes that
are not JSON. Whatever comes in: no 500, no hang (each answer within a bound), and the daemon
back to idle (nothing in flight) after each case. One real daemon with real runners; the model
names it may hit are the tiny generated ones, so a case that does generate is quick.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import test_http
from daemonutil import until
from test_http import Served

served = test_http.served

POST_ROUTES = ["/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/api/show",
               "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank",
               "/rerank"]
GET_ROUTES = ["/", "/api/version", "/api/tags", "/api/ps", "/v1/models", "/metrics"]
FIELDS = ["model", "prompt", "messages", "role", "content", "input", "inputs", "query",
          "documents", "texts", "top_n", "stream", "options", "num_predict", "num_ctx",
          "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "keep_alive", "raw",
          "system", "encoding_format", "return_documents", "stream_options", "name"]
#: Strings that have broken things: surrogates, NUL, control and format characters, big text.
NASTY = ["\ud83d", "a\udc80b", "\x00", "\u202e", "\ufeff", "😀", "\n\r\t", "%s%n", "{{x}}",
         "<|im_start|>", "../../etc/passwd", "x" * 5000, "tiny", "default", "0", "-1"]
#: Answers allowed: success, every client error; 503 only when busy (never expected here).
OK_STATUSES = {200, 400, 404, 405, 413, 499}

text = st.one_of(st.sampled_from(NASTY), st.text(max_size=40))
number = st.one_of(st.integers(min_value=-(1 << 70), max_value=1 << 70),
                   st.sampled_from([0, -1, 1, 2**31, 2**63, 10**30]),
                   st.floats(allow_nan=False, allow_infinity=False))
scalar = st.one_of(st.none(), st.booleans(), number, text)
value = st.recursive(scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(FIELDS), text), inner, max_size=4)),
    max_leaves=12)
model = st.one_of(st.sampled_from(["tiny", "tiny:latest", "", "default"]), scalar)
message = st.fixed_dictionaries({}, optional={"role": st.one_of(
    st.sampled_from(["user", "system", "assistant", "tool", "wizard"]), scalar),
    "content": value})
body = st.one_of(
    st.fixed_dictionaries({"model": model}, optional={
        "prompt": st.one_of(text, value), "messages": st.one_of(st.lists(message, max_size=3),
                                                                value),
        "input": value, "query": value, "documents": value, "stream": st.one_of(
            st.booleans(), scalar), "options": st.one_of(st.dictionaries(
                st.sampled_from(FIELDS), scalar, max_size=4), value),
        "max_tokens": scalar, "keep_alive": scalar, "raw": scalar, "top_n": scalar}),
    st.dictionaries(st.one_of(st.sampled_from(FIELDS), text), value, max_size=5),
    value)


def _idle(s: Served) -> bool:
    return int(s.stats()["in_flight"]) == 0


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(route=st.sampled_from(POST_ROUTES), doc=body, raw=st.one_of(st.none(), st.binary(
    max_size=64)))
def test_random_bodies_never_500_hang_or_wedge(served: Served, route: str, doc: Any,
                                               raw: bytes | None) -> None:
    data = raw if raw is not None else json.dumps(doc).encode()  # surrogates stay \\u escapes
    r = httpx.post(f"{served.base}{route}", content=data, timeout=60,
                   headers={"Content-Type": "application/json"})
    r.read()  # a stream is read to its end
    assert r.status_code in OK_STATUSES, (route, data[:300], r.status_code, r.text[:300])
    if r.status_code != 200:
        assert r.headers["content-type"].startswith("application/json"), r.headers
        json.loads(r.content)
    until(lambda: _idle(served), timeout=30, what="the daemon back to idle",
          show=lambda: served.d.client().ps())


@pytest.mark.parametrize("route", GET_ROUTES)
def test_get_routes_with_odd_queries(served: Served, route: str) -> None:
    r = httpx.get(f"{served.base}{route}", params={"x": "\x00", "model": "%ff"}, timeout=30)
    assert r.status_code == 200, (route, r.status_code, r.text[:200])

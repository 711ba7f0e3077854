"""modeld's errors have their HTTP statuses in one table (``modeld.http.common.STATUS``): every
error code has one, the pull's own included, and every route answers with it."""

from __future__ import annotations

from modeld.errors import (
    CancelledError,
    ErrorCode,
    ModeldError,
    NetworkError,
    UnauthorizedError,
)
from modeld.http import anthropic, ollama, openai, pull
from modeld.http.common import STATUS, BodyTooLarge, status_of


def test_every_error_code_has_one_status() -> None:
    assert set(STATUS) == set(ErrorCode)
    assert all(400 <= s < 600 for s in STATUS.values())
    assert status_of(BodyTooLarge(10)) == 413  # an invalid request, but too large to read


def test_every_route_answers_with_the_tables_status() -> None:
    errors: list[ModeldError] = [UnauthorizedError("gated"), NetworkError("down"),
                                 CancelledError("left")]
    for exc in errors:
        for render in (ollama.error, openai.error, pull.error):
            assert render(exc).status_code == STATUS[exc.code], (render, exc.code)
    assert anthropic.error(NetworkError("down")).status_code == 502
    assert anthropic.error(CancelledError("left")).status_code == 400  # Anthropic has no 499

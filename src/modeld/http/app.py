"""The ASGI application: Ollama's, OpenAI's and Anthropic's routes, /metrics, behind the access
guard."""

from __future__ import annotations

import logging
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from modeld.config import Settings
from modeld.errors import ModeldError, clip
from modeld.http import ollama, openai
from modeld.http.anthropic import AnthropicAPI
from modeld.http.bridge import Bridge
from modeld.http.disconnect import Watch
from modeld.http.metrics import Metrics
from modeld.http.ollama import OllamaAPI
from modeld.http.openai import OpenAIAPI
from modeld.http.pull import PullAPI
from modeld.http.responses import ResponsesAPI
from modeld.http.security import Guard

log = logging.getLogger("modeld.http")


async def _not_found(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": f"no such endpoint: {clip(request.method, 20)} "
                                  f"{clip(request.url.path)}"}, status_code=404)


def _api_error(request: Request, exc: ModeldError) -> Response:
    """The error in the shape of the API the path belongs to (OpenAI's under /v1)."""
    path = request.url.path
    return (openai.error if path.startswith("/v1/") or path == "/rerank" else ollama.error)(exc)


async def _modeld_error(request: Request, exc: Exception) -> Response:
    """A domain error no route caught: still a JSON answer with its status, never a plain
    500 page (issue 21: ``"model": 123`` was one)."""
    assert isinstance(exc, ModeldError)
    return _api_error(request, exc)


async def _internal(request: Request, exc: Exception) -> Response:
    log.error("HTTP %s %s failed", request.method, request.url.path, exc_info=exc)
    return _api_error(request, ModeldError(f"internal error: {type(exc).__name__}",
                                           hint="see the daemon log"))


def build(settings: Settings, bridge: Bridge) -> Any:
    """The whole front door as one ASGI callable."""
    metrics = Metrics(bridge)
    routes = [*OllamaAPI(bridge, settings).routes(), *OpenAIAPI(bridge, settings).routes(),
              *PullAPI(bridge, settings).routes(),
              *AnthropicAPI(bridge, settings).routes(), *ResponsesAPI(bridge, settings).routes(),
              Route("/metrics", metrics.endpoint, methods=["GET"])]
    app = Starlette(routes=routes, exception_handlers={
        404: _not_found, ModeldError: _modeld_error, Exception: _internal})
    known = frozenset(r.path for r in routes)
    return Guard(Watch(metrics.timer(app, known)), settings)

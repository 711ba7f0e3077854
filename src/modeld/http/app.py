"""The ASGI application: Ollama's, OpenAI's and Anthropic's routes, /metrics, behind the access
guard."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from modeld.config import Settings
from modeld.http.anthropic import AnthropicAPI
from modeld.http.bridge import Bridge
from modeld.http.metrics import Metrics
from modeld.http.ollama import OllamaAPI
from modeld.http.openai import OpenAIAPI
from modeld.http.responses import ResponsesAPI
from modeld.http.security import Guard


async def _not_found(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": f"no such endpoint: {request.method} {request.url.path}"},
                        status_code=404)


def build(settings: Settings, bridge: Bridge) -> Any:
    """The whole front door as one ASGI callable."""
    metrics = Metrics(bridge)
    routes = [*OllamaAPI(bridge, settings).routes(), *OpenAIAPI(bridge, settings).routes(),
              *AnthropicAPI(bridge, settings).routes(), *ResponsesAPI(bridge, settings).routes(),
              Route("/metrics", metrics.endpoint, methods=["GET"])]
    app = Starlette(routes=routes, exception_handlers={404: _not_found})
    known = frozenset(r.path for r in routes)
    return Guard(metrics.timer(app, known), settings)

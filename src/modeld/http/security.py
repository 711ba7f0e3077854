"""Who may use the HTTP front door.

- Bound to loopback (the default), a request's ``Host`` must name a loopback host: a web page
  that rebinds its own DNS name to 127.0.0.1 still sends its name as Host (CVE-2024-28224).
- An ``Origin`` header (a browser) must be a loopback origin or one of ``http_origins``; only
  those configured origins get CORS headers.
- Bound to anything else, an API key is required (the daemon refuses to start without one) and
  every request must carry ``Authorization: Bearer <key>`` or ``x-api-key: <key>`` (what
  Anthropic's clients send).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from modeld.config import Settings, is_loopback

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _host_only(value: str) -> str:
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Guard:
    """ASGI middleware applying the rules above before any route runs."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        address = settings.http_address
        self.loopback = address is None or is_loopback(address[0])
        self.key = settings.api_key
        self.origins = frozenset(settings.http_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        refusal = self._refusal(headers, origin)
        if refusal is not None:
            await _reply(send, *refusal)
            return
        if origin and origin in self.origins:
            if scope["method"] == "OPTIONS":  # a CORS preflight
                await _reply(send, 204, None, _cors(origin, preflight=True))
                return
            await self.app(scope, receive, _with_headers(send, _cors(origin)))
            return
        await self.app(scope, receive, send)

    def _refusal(self, headers: dict[str, str], origin: str | None
                 ) -> tuple[int, dict[str, Any], list[tuple[bytes, bytes]]] | None:
        if self.loopback and not is_loopback(_host_only(headers.get("host", ""))):
            return 403, {"error": "forbidden: the Host header must name this machine's "
                                  "loopback address (DNS rebinding protection)"}, []
        if origin and origin not in self.origins and not _loopback_origin(origin):
            return 403, {"error": f"forbidden: origin {origin} is not allowed (add it to "
                                  "http_origins)"}, []
        if self.key is not None:
            bearer = headers.get("authorization", "").encode()
            given = headers.get("x-api-key", "").encode()
            if not (hmac.compare_digest(bearer, f"Bearer {self.key}".encode())
                    or hmac.compare_digest(given, self.key.encode())):
                return 401, {"error": "unauthorized: send Authorization: Bearer <api_key> "
                                      "(or x-api-key: <api_key>)"}, [
                    (b"www-authenticate", b"Bearer")]
        return None


def _loopback_origin(origin: str) -> bool:
    host = urlsplit(origin).hostname or ""
    return is_loopback(host)


def _cors(origin: str, preflight: bool = False) -> list[tuple[bytes, bytes]]:
    out = [(b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin")]
    if preflight:
        out += [(b"access-control-allow-methods", b"GET, POST, HEAD, OPTIONS"),
                (b"access-control-allow-headers",
                 b"Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta"),
                (b"access-control-max-age", b"600")]
    return out


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), *extra]
        await send(message)
    return wrapped


async def _reply(send: Send, status: int, body: dict[str, Any] | None,
                 headers: list[tuple[bytes, bytes]]) -> None:
    data = b"" if body is None else json.dumps(body).encode()
    hdrs = [*headers, (b"content-length", str(len(data)).encode())]
    if body is not None:
        hdrs.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": data})

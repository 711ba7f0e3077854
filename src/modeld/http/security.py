"""Who may use the HTTP front door.

- Bound to loopback (the default), a request's ``Host`` must name a loopback host: a web page
  that rebinds its own DNS name to 127.0.0.1 still sends its name as Host (CVE-2024-28224).
  The Host is parsed: a loopback IP literal, ``localhost`` or the host of a configured
  ``http_origins`` entry passes; a name that merely starts like one
  (``127.0.0.1.evil.com``) does not.
- An ``Origin`` header (a browser) must be a loopback origin or one of ``http_origins``; only
  those configured origins get CORS headers.
- Bound to anything else, an API key is required (the daemon refuses to start without one) and
  every request must carry ``Authorization: Bearer <key>`` or ``x-api-key: <key>`` (what
  Anthropic's clients send); a refused request's connection is closed at once (its body is
  never read). Slow heads and bodies are time-limited before this (:mod:`.limits`).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from modeld.config import Settings
from modeld.errors import clip
from modeld.settingvalues import is_loopback

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def host_name(value: str) -> str | None:
    """The host of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lower-cased
    without brackets or port, or None when it does not parse as one (a refusal)."""
    value = value.strip()
    if not value or any(c in value for c in "/?#@ \\"):
        return None
    try:
        parts = urlsplit(f"//{value}")
        parts.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError:
        return None
    return parts.hostname or None


def origin_host(origin: str) -> str | None:
    """The host of an ``Origin`` (``scheme://host[:port]``), or None when it is not one."""
    try:
        parts = urlsplit(origin.strip())
        parts.port  # noqa: B018
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or parts.path or parts.query or parts.username:
        return None
    return parts.hostname or None


class Guard:
    """ASGI middleware applying the rules above before any route runs."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        address = settings.http_address
        self.loopback = address is None or is_loopback(address[0])
        self.key = settings.api_key
        self.origins = frozenset(settings.http_origins)
        # names besides loopback ones a Host may carry: the hosts of the configured origins
        self.names = frozenset(h for h in (origin_host(o) for o in self.origins) if h)

    def host_allowed(self, host_header: str) -> bool:
        """Only loopback IP literals, ``localhost`` and the configured origins' host names."""
        name = host_name(host_header)
        return name is not None and (is_loopback(name) or name in self.names)

    def origin_allowed(self, origin: str) -> bool:
        if origin in self.origins:
            return True
        host = origin_host(origin)
        return host is not None and is_loopback(host)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        origin = headers.get("origin")
        refusal = self._refusal(headers, origin)
        if refusal is not None:
            if not self.loopback:  # beyond loopback: a refused connection is not kept open
                refusal[2].append((b"connection", b"close"))
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
        if self.loopback and not self.host_allowed(headers.get("host", "")):
            return 403, {"error": "forbidden: the Host header must name this machine's "
                                  "loopback address (DNS rebinding protection)"}, []
        if origin and not self.origin_allowed(origin):
            return 403, {"error": f"forbidden: origin {clip(origin)} is not allowed (add it "
                                  "to http_origins)"}, []
        if self.key is not None:
            scheme, _, token = headers.get("authorization", "").strip().partition(" ")
            bearer = token.strip().encode() if scheme.lower() == "bearer" else b""
            given = headers.get("x-api-key", "").encode()
            key = self.key.encode()  # the scheme's case is free (RFC 9110), the key's is not
            if not (hmac.compare_digest(bearer, key) | hmac.compare_digest(given, key)):
                return 401, {"error": "unauthorized: send Authorization: Bearer <api_key> "
                                      "(or x-api-key: <api_key>)"}, [
                    (b"www-authenticate", b"Bearer")]
        return None


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

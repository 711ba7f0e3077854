"""Start and stop the HTTP front door inside the daemon process (a thread running uvicorn).

The listening socket is bound here, before uvicorn starts, so a port already taken is one
clear warning while the ZeroMQ side goes on serving (uvicorn itself would exit the process).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any

from modeld.config import Settings
from modeld.errors import InvalidRequestError
from modeld.http import fds
from modeld.settingvalues import is_loopback

log = logging.getLogger("modeld.http")


def check_exposure(settings: Settings) -> None:
    """A non-loopback address without an API key is refused before anything starts."""
    address = settings.http_address
    if address is not None and not is_loopback(address[0]) and not settings.api_key:
        raise InvalidRequestError(
            f"http is set to {settings.http}, which other machines can reach, and no api_key "
            "is set",
            hint="set MODELD_API_KEY (or api_key in the config file) so clients must send "
            "Authorization: Bearer <key>, or keep http on 127.0.0.1",
        )


class FrontDoor:
    """uvicorn serving :func:`modeld.http.app.build` on a pre-bound socket, in a thread."""

    def __init__(self, settings: Settings, endpoint: str, sock: socket.socket) -> None:
        import uvicorn

        from modeld.http.app import build
        from modeld.http.bridge import Bridge
        from modeld.http.limits import protocol_class

        self.sock = sock
        self.bridge = Bridge(endpoint)
        # h11 with time limits on request heads and bodies, a per-client cap, a cap on all
        # connections and the local users it serves (limits.py); ``backlog`` is also how many
        # connections asyncio accepts at once (uvicorn's default: 2048)
        self.protocol = protocol_class(settings)
        config = uvicorn.Config(build(settings, self.bridge), log_level="warning",
                                access_log=False, lifespan="off", loop="asyncio",
                                http=self.protocol, ws="none", backlog=fds.BACKLOG,
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, name="http", daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        from modeld.http.pull import ACTIVE

        self.server.should_exit = True
        ACTIVE.stop(3.0)  # cancelled pulls shut their connections and remove their locks
        self.thread.join(5)
        self.bridge.close()
        self.sock.close()

    @property
    def address(self) -> tuple[Any, ...]:
        return tuple(self.sock.getsockname())


def start(settings: Settings, endpoint: str) -> FrontDoor | None:
    """The running front door, or None when ``http`` is off or its port cannot be had."""
    address = settings.http_address
    if address is None:
        return None
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(fds.BACKLOG)
    except OSError as exc:
        sock.close()
        log.warning("HTTP front door not started: cannot listen on %s:%d (%s); the ZeroMQ "
                    "socket is serving. Free the port or set http (MODELD_HTTP) to another "
                    "address, or off", host, port, exc.strerror)
        return None
    door = FrontDoor(settings, endpoint, sock)
    door.start()
    limits = door.protocol.limits
    log.info("HTTP front door (Ollama, OpenAI and Anthropic APIs) on http://%s:%d: at most %d "
             "connections, local users served: %s", host, port, limits.total,
             {"owner": "this one (and root)", "key": "others with the api_key",
              "all": "all"}[limits.strangers])
    return door

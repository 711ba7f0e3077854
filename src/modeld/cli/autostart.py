"""Starting the daemon on demand (``modeld run`` with no daemon) and preloading models.

The daemon is started as a detached ``python -m modeld serve`` in its own session, logging to
the user log dir, and we wait until it answers a ping. Two clients racing to start it are safe:
the lock file makes the second daemon exit, and both clients then talk to the first.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

from modeld import paths
from modeld.cli import render
from modeld.config import Settings
from modeld.errors import DaemonUnavailableError, ModeldError, unusable_path

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0


def start_daemon(settings: Settings, timeout: float = START_TIMEOUT_S) -> None:
    """Start a background daemon for ``settings.socket`` and wait until it answers."""
    from modeld.client import Client

    log_dir = settings.log_dir
    out_path = log_dir / "daemon-autostart.log"
    env = dict(os.environ, MODELD_SOCKET=settings.socket)
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        out = open(out_path, "ab")  # noqa: SIM115 - closed below, after Popen
    except OSError as exc:
        raise unusable_path(exc, "log_dir") from None
    with out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "modeld", "serve"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    render.message(f"modeld: started the daemon in the background (pid {proc.pid}, log {log_dir})")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock = paths.ipc_path(settings.socket)
        if sock is None or sock.exists():
            client = Client(settings.socket, timeout=2.0, connect_timeout=1.0)
            try:
                client.ping()
                return
            except DaemonUnavailableError:
                pass
            finally:
                client.close()
        if proc.poll() is not None and not (sock is not None and sock.exists()):
            raise DaemonUnavailableError(
                f"the daemon exited at start with status {proc.returncode}",
                hint=f"see {out_path} for why",
            )
        time.sleep(0.05)
    raise DaemonUnavailableError(
        f"the daemon did not answer within {timeout:.0f}s", hint=f"see {out_path} for why"
    )


def preload_in_background(settings: Settings, models: list[str]) -> None:
    """Load ``models`` once the daemon in this process is up (``modeld serve --preload``)."""

    def work() -> None:
        from modeld.client import Client

        deadline = time.monotonic() + START_TIMEOUT_S
        sock = paths.ipc_path(settings.socket)
        while sock is not None and not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with Client(settings.socket, timeout=None) as client:
            for ref in models:
                try:
                    client.load(None if ref == "default" else ref)
                    log.info("preloaded %s", ref)
                except ModeldError as exc:
                    log.error("preload of %s failed: %s", ref, exc)

    threading.Thread(target=work, name="preload", daemon=True).start()

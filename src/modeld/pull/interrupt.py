"""Shut a pull's connection down when the pull is cancelled, so a read blocked on a hub that
stalls returns at once instead of after the read timeout (60 s): a daemon that stops, a client
of ``/api/pull`` that leaves. A watcher thread holds a duplicate of the connection's
descriptor for the duration of the block.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import threading
from collections.abc import Iterator

CANCEL_POLL_S = 0.1  # how soon a cancelled pull shuts a stalled connection down


@contextlib.contextmanager
def interrupt_on(cancel: threading.Event | None,
                 resp: http.client.HTTPResponse) -> Iterator[None]:
    """While in the block: once ``cancel`` is set, shut the response's connection down, so a
    read blocked on a hub that stalls returns at once instead of after the read timeout
    (the ``/api/pull`` of a daemon that stops, a client that leaves)."""
    if cancel is None:
        yield
        return
    try:
        sock = socket.socket(fileno=os.dup(resp.fileno()))
    except (OSError, ValueError):  # no socket under it (closed already)
        yield
        return
    over = threading.Event()

    def watch() -> None:
        with sock:  # a duplicate of the response's descriptor: closing it closes nothing else
            while not over.is_set():
                if cancel.wait(CANCEL_POLL_S):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    return

    threading.Thread(target=watch, name="pull-cancel", daemon=True).start()
    try:
        yield
    finally:
        over.set()  # the watcher ends within CANCEL_POLL_S

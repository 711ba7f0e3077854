"""The daemon's file descriptors: how many it may open, and how many HTTP may take of them.

libzmq aborts the whole process when its ROUTER cannot accept a connection for want of a
descriptor ("Too many open files (src/ipc_listener.cpp:297)"): ~1,100 idle HTTP connections
under the default soft limit of 1,024 took every model and request down with it. So the daemon
raises its soft limit to the hard one at start (:func:`raise_limit`), and the HTTP front door
holds at most :func:`http_cap` connections: what is left of the limit after a reserve for the
daemon's own sockets, runners, pipes and logs and a listen backlog's worth of connections
accepted at once before any is looked at, counting each connection at
:data:`FDS_PER_CONNECTION` (its socket, and while it has a request at the daemon its DEALER's
eventfd and both ends of that DEALER's unix socket).
"""

from __future__ import annotations

import logging

log = logging.getLogger("modeld.http")

#: Connections the kernel may queue and asyncio accepts in one go (uvicorn's ``backlog``).
BACKLOG = 128
#: Descriptors kept for everything but HTTP connections: the ZeroMQ sockets (the CLI's
#: connections, the runners'), runner pipes, log files, the bridge's kept DEALERs.
RESERVE = 256
#: Descriptors one HTTP connection may hold in the daemon while its request runs.
FDS_PER_CONNECTION = 4
#: The fewest connections the front door keeps (a very low limit still serves a few).
FLOOR = 8


def raise_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the soft limit it has now (0 when the
    platform has none)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    elif hard == resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY:
        soft = max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        except (OSError, ValueError):
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def current_limit() -> int:
    """The soft RLIMIT_NOFILE now (1 << 20 when unlimited or unknown)."""
    try:
        import resource
    except ImportError:
        return 1 << 20
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return int(soft) if soft != resource.RLIM_INFINITY else 1 << 20


def http_cap(wanted: int, limit: int) -> int:
    """The HTTP connections the daemon may hold under a descriptor ``limit``: ``wanted`` (the
    ``http_connections`` setting) or fewer."""
    room = (limit - RESERVE - BACKLOG) // FDS_PER_CONNECTION
    return max(FLOOR, min(wanted, room))

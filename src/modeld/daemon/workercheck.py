"""Before a loaded model is reloaded onto other llama.cpp RPC workers, each new worker is asked
``HELLO`` (:func:`modeld.rpc.probe`), in a thread of its own so the daemon's event loop serves
everyone else meanwhile: a port that is no worker (an HTTP server), a worker of another
version, a busy or an unreachable one fails the request while the working model stays loaded
and answers. A TCP connection alone (what was checked before) let any listening port pass, and
the healthy model was unloaded for a load that could not start.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Future

from modeld.errors import RpcWorkerError
from modeld.rpc import probe, require_reachable, worker_error


def start(endpoints: Iterable[str], serving: Iterable[str]) -> Future[None]:
    """Check ``endpoints`` in a daemon thread: each answers ``HELLO`` with this build's
    protocol, except those in ``serving`` (this model's runner holds their one connection, so
    they cannot answer; they need only accept one). The future's exception is the
    :class:`RpcWorkerError` about the first that fails."""
    asked, held = tuple(endpoints), frozenset(serving)
    done: Future[None] = Future()

    def run() -> None:
        try:
            for endpoint in asked:
                if endpoint in held:
                    require_reachable([endpoint])
                else:
                    probe(endpoint)
        except RpcWorkerError as exc:
            done.set_exception(exc)
        except Exception as exc:  # a bug must still end the check, never leave it pending
            done.set_exception(worker_error(asked[0], f"checking rpc workers failed: {exc}",
                                            "see the daemon log", "check"))
        else:
            done.set_result(None)

    threading.Thread(target=run, name="rpc-check", daemon=True).start()
    return done

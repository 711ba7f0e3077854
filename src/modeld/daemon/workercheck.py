"""Before a loaded model is reloaded onto other llama.cpp RPC workers, each new worker is asked
``HELLO`` (:func:`modeld.rpc.endpoints.probe`), in a thread of its own so the daemon's event
loop serves everyone else meanwhile: a port that is no worker (an HTTP server), a worker of another
version, a busy or an unreachable one fails the request while the working model stays loaded
and answers. A TCP connection alone (what was checked before) let any listening port pass, and
the healthy model was unloaded for a load that could not start. A model not loaded yet is
checked the same way before admission (:class:`Prechecks`), which could evict idle models
for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future

from modeld.daemon.jobs import Job
from modeld.errors import ModeldError, RpcWorkerError
from modeld.rpc.endpoints import probe, require_reachable, worker_error


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


class Prechecks:
    """Requests to load a model that is not loaded onto RPC workers, held until their workers
    answered ``HELLO``: before admission, which may evict idle models to make room, and before
    other requests for the model join a load that cannot start."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def hold(self, job: Job) -> bool:
        """Start asking ``job``'s workers (True: it is held now); False once they answered."""
        if job.rpc_check is not None:
            return False
        job.rpc_check = start(job.rpc or (), serving=())
        self.jobs.append(job)
        return True

    def settle(self, open_jobs: Mapping[tuple[bytes, str], Job], route: Callable[[Job], None],
               fail: Callable[[Job, ModeldError], None]) -> None:
        """The held requests whose check ended go on (``route``) or fail with its error (no
        model was evicted or started for them); cancelled ones (no longer in ``open_jobs``)
        are dropped."""
        done = [j for j in self.jobs if j.rpc_check is not None and j.rpc_check.done()]
        for job in done:
            self.jobs.remove(job)
            if open_jobs.get((job.client, job.rid)) is job:
                err = job.rpc_check.exception() if job.rpc_check is not None else None
                if isinstance(err, ModeldError):
                    fail(job, err)
                else:
                    route(job)

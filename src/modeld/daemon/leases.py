"""Leases of llama.cpp RPC workers: each worker serves one runner at a time.

A worker serves one client connection at a time and a second client blocks forever inside
llama.cpp, so the daemon lends each endpoint to one runner, from the moment its load starts
until that runner process has exited (its connection, and with it the worker's buffers, go
with the process). Pure bookkeeping, owned by the daemon's event loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from modeld.errors import RpcWorkerError


@dataclass(frozen=True)
class Lease:
    endpoint: str
    runner_id: str
    model: str  # the name the model was loaded under


class RpcLeases:
    """Which runner holds which worker."""

    def __init__(self) -> None:
        self._by_endpoint: dict[str, Lease] = {}

    def held(self, endpoints: Iterable[str]) -> list[Lease]:
        """The leases on any of ``endpoints`` (empty: all free)."""
        return [self._by_endpoint[ep] for ep in endpoints if ep in self._by_endpoint]

    def take(self, endpoints: Iterable[str], runner_id: str, model: str) -> None:
        """Lend ``endpoints`` to ``runner_id`` (each must be free, or its own already)."""
        eps = list(endpoints)
        for lease in self.held(eps):
            if lease.runner_id != runner_id:
                raise ValueError(f"{lease.endpoint} is leased to runner {lease.runner_id}")
        for ep in eps:
            self._by_endpoint[ep] = Lease(ep, runner_id, model)

    def release(self, runner_id: str) -> list[str]:
        """The runner has exited: its workers are free again (their endpoints returned)."""
        freed = [ep for ep, lease in self._by_endpoint.items() if lease.runner_id == runner_id]
        for ep in freed:
            del self._by_endpoint[ep]
        return freed

    def all(self) -> list[Lease]:
        return list(self._by_endpoint.values())


def leased_error(lease: Lease, name: str) -> RpcWorkerError:
    """The error for ``name`` asking for a worker ``lease`` lends to another loaded model."""
    return RpcWorkerError(
        f"rpc worker {lease.endpoint} is in use by {lease.model} (runner {lease.runner_id}); a "
        "worker serves one model at a time",
        hint=f"unload it first (modeld unload {lease.model}), or give {name} other workers "
        "(modeld rpc-worker --port N on another port)",
        details={"endpoint": lease.endpoint, "problem": "leased", "leased_to": lease.model},
    )

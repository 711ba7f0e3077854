"""Ray Serve glue (the only module that imports Ray): a deployment beside each daemon and the
ingress deployment that routes between them.

Why the ingress routes itself rather than through Ray's multiplexing or a custom
``RequestRouter``: multiplexing keeps its own per-replica LRU of model ids, which is not the
daemon's memory-aware cache (an eviction or keep-alive expiry on the daemon would not be seen),
and the ``RequestRouter`` API is alpha and sees replica state only through periodic
``routing_stats``. The placement decision needs the daemon's dry run for the requested model at
the moment of the request, so the ingress asks each node and routes with stable Serve APIs:
one deployment per node (``modeld-node-<i>``, one replica each, needing the custom resource
``modeld``, of which each machine offers 1: so one per machine) and a handle per deployment.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, cast

import ray
from ray import serve
from ray.serve.handle import DeploymentHandle

from modeld.cluster.ingress import Ingress, check_access
from modeld.cluster.node import NodeAgent
from modeld.config import Settings
from modeld.errors import InvalidRequestError

APP_NAME = "modeld"
RESOURCE = "modeld"
#: The resource only Ray's head node has: the ingress runs there, beside Serve's HTTP proxy
#: (HeadOnly), so a worker machine that leaves never takes the front door with it.
HEAD = "node:__internal_head__"


@serve.deployment(ray_actor_options={"num_cpus": 0, "resources": {RESOURCE: 1}},
                  max_ongoing_requests=10_000, health_check_period_s=5)
class ModeldNode:
    """Runs beside one machine's daemon (started if none answers)."""

    def __init__(self) -> None:
        self.agent = NodeAgent.from_environment(ray.get_runtime_context().get_node_id())

    async def probe(self, model: str | None) -> dict[str, Any]:
        return await self.agent.probe(model)

    async def status(self) -> dict[str, Any]:
        return await self.agent.status()

    async def http(self, info: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        async for message in self.agent.http(info):
            yield message

    async def cancel(self, request_id: str) -> None:
        await self.agent.cancel(request_id)

    def check_health(self) -> None:
        self.agent.ping()  # a daemon that stopped answering makes Serve restart the replica


class _HandleLink:
    """A :class:`modeld.cluster.ingress.NodeLink` over a Serve deployment handle."""

    def __init__(self, key: str, handle: DeploymentHandle[Any]) -> None:
        self.key = key
        self.handle = handle

    async def probe(self, model: str | None) -> dict[str, Any]:
        return await self.handle.probe.remote(model)  # type: ignore[no-any-return]

    async def status(self) -> dict[str, Any]:
        return await self.handle.status.remote()  # type: ignore[no-any-return]

    async def http(self, info: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        stream: Any = self.handle.options(stream=True).http.remote(info)
        try:
            async for message in stream:
                yield message
        finally:
            stream.cancel()

    async def cancel(self, request_id: str) -> None:
        await self.handle.cancel.remote(request_id)


@serve.deployment(ray_actor_options={"num_cpus": 0, "resources": {HEAD: 0.001}},
                  max_ongoing_requests=10_000)
@serve.ingress()
class ModeldIngress:
    """The HTTP front door: modeld's access rules, then :class:`Ingress`."""

    def __init__(self, nodes: dict[str, DeploymentHandle[Any]], settings: Settings,
                 policy: str) -> None:
        links = [_HandleLink(key, handle) for key, handle in sorted(nodes.items())]
        self.settings = settings
        self.ingress = Ingress(links, policy, int(settings.max_message_bytes))

    def __serve_build_asgi_app__(self) -> Any:
        from modeld.http.security import Guard

        return Guard(self.ingress, self.settings)


def modeld_nodes() -> int:
    """How many machines of the connected Ray cluster offer the ``modeld`` resource."""
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return len([n for n in nodes if n.get("Alive") and n["Resources"].get(RESOURCE)])


def deploy(settings: Settings, *, nodes: int | None = None, policy: str = "placement",
           address: str | None = None) -> dict[str, Any]:
    """Deploy the ingress and one node deployment per ``modeld`` machine on the Ray cluster at
    ``address`` (None: the one this process is connected to, else ``auto``)."""
    host, port = check_access(settings)
    if not ray.is_initialized():
        ray.init(address=address or "auto", logging_level=logging.WARNING, log_to_driver=False)
    count = modeld_nodes() if nodes is None else nodes
    if count < 1:
        raise InvalidRequestError(
            f"no node of the Ray cluster offers the resource {RESOURCE!r}",
            hint=f"start Ray on each machine with --resources '{{\"{RESOURCE}\": 1}}'")
    serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port})
    node, ingress = cast(Any, ModeldNode), cast(Any, ModeldIngress)  # Serve Deployments
    handles = {f"modeld-node-{i}": node.options(name=f"modeld-node-{i}").bind()
               for i in range(count)}
    app = ingress.bind(handles, settings, policy)
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    return {"url": f"http://{host}:{port}", "nodes": count, "policy": policy, "app": APP_NAME}


def undeploy() -> None:
    """Delete the modeld application (the daemons keep running)."""
    serve.delete(APP_NAME)

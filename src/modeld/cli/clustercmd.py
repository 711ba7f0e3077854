"""``modeld cluster serve|ps``: several daemons behind one HTTP front door on Ray Serve.

``serve`` deploys the ingress and one node deployment per machine offering the Ray resource
``modeld`` onto a running Ray cluster (it needs the ``modeld[ray]`` extra) and returns: the
application lives in the cluster until ``serve shutdown`` (Ray's CLI) or Ray stops. ``ps`` asks
the ingress over HTTP (``GET /cluster/ps``): no Ray on the calling machine.
Only typer and the standard library are imported at the top (CLI start-up time).
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # the CLI imports this module at start-up: nothing more than it needs
    from modeld.config import Settings

#: Where the cluster's HTTP front door listens by default (Ray Serve's own default port, so
#: it does not clash with a daemon's front door on 11434 on the same machine).
DEFAULT_HTTP = "127.0.0.1:8000"
SERVE_ONLY = ("address", "nodes", "policy")


def serve_command(settings: Settings, *, address: str | None, nodes: int | None,
                  policy: str) -> dict[str, Any]:
    """Deploy onto the Ray cluster at ``address``; what was deployed."""
    from modeld.cluster.ingress import check_access
    from modeld.errors import InvalidRequestError

    check_access(settings)  # before Ray is imported: a refusal costs nothing
    try:
        from modeld.cluster import serve as cluster_serve
    except ImportError as exc:
        raise InvalidRequestError(
            f"modeld cluster needs Ray Serve ({exc.name} is not installed)",
            hint="pip install 'modeld[ray]' on every machine of the cluster") from None
    if nodes is not None and nodes < 1:
        raise InvalidRequestError("--nodes must be at least 1", hint="or leave it out: one per "
                                  "machine offering the Ray resource 'modeld'")
    return cluster_serve.deploy(settings, nodes=nodes, policy=policy, address=address)


def ps_command(settings: Settings) -> dict[str, Any]:
    """Every node's models, memory and requests, from the cluster's ingress."""
    import json
    import urllib.error
    import urllib.request

    from modeld.errors import DaemonUnavailableError, InvalidRequestError, UnauthorizedError
    from modeld.settingvalues import parse_http_address

    address = parse_http_address(settings.http)
    if address is None:
        raise InvalidRequestError("--http cannot be off for cluster ps",
                                  hint=f"pass the ingress's HOST:PORT (default {DEFAULT_HTTP})")
    host, port = address
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/cluster/ps"
    request = urllib.request.Request(url, headers={"Host": host})
    if settings.api_key:
        request.add_header("Authorization", f"Bearer {settings.api_key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            data: dict[str, Any] = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise UnauthorizedError(f"the cluster ingress at {url} refused: HTTP {exc.code}",
                                    hint="set api_key (MODELD_API_KEY) to the cluster's key"
                                    ) from None
        raise DaemonUnavailableError(f"the cluster ingress at {url} answered HTTP {exc.code}",
                                     hint="is `modeld cluster serve` deployed there?") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DaemonUnavailableError(f"no cluster ingress at {url} ({reason})",
                                     hint="start it with modeld cluster serve, or pass --http"
                                     ) from None
    data["url"] = url.removesuffix("/cluster/ps")
    return data


def ps_text(data: dict[str, Any]) -> list[str]:
    """The ``cluster ps`` table: one line per loaded model, grouped by node."""
    from modeld.cli import pstable

    headers = ("NODE", "MODEL", "STATE", "MEM meas/est", "CTX", "REQ", "UNTIL")
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    for node in data.get("nodes", []):
        name = str(node.get("node"))
        if not node.get("up"):
            rows.append((name, "-", "down", "-", "-", "-", "-"))
            notes.append(f"{name}: {node.get('error')}")
            continue
        notes.append(f"{name}: {pstable.fmt_bytes(node.get('used_bytes'))} of "
                     f"{pstable.fmt_bytes(node.get('budget_bytes'))} used, "
                     f"{node.get('in_flight', 0)} request(s) from the ingress now, "
                     f"{node.get('routed', 0)} routed")
        models = node.get("models") or []
        if not models:
            rows.append((name, "-", "empty", "-", "-", "-", "-"))
        for m in models:
            rows.append((name, str(m.get("name")), str(m.get("state")),
                         pstable.mem_pair(m.get("measured_bytes"), m.get("estimate_bytes")),
                         pstable.ctx_cell(m.get("n_ctx"), m.get("parallel"),
                                          m.get("kv_unified")),
                         f"{m.get('in_flight', 0)}/{m.get('queued', 0)}", pstable.until(m)))
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in (headers, *rows)]
    lines.insert(1, "  ".join("─" * w for w in widths))
    footer = [f"{data.get('url', '')}: {data.get('policy')} routing"]
    return ["\n".join([*lines, "", *notes, *footer]) + "\n"]


class ClusterAction(StrEnum):
    serve = "serve"
    ps = "ps"


def cluster(
    action: Annotated[
        ClusterAction,
        typer.Argument(help="serve: deploy onto a Ray cluster; ps: every machine's models."),
    ],
    http: Annotated[
        str | None,
        typer.Option(help='The cluster\'s HTTP front door "HOST:PORT" (default 127.0.0.1:8000).'),
    ] = None,
    address: Annotated[
        str | None, typer.Option(help="serve: the Ray cluster to join (default: auto).")
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(help="serve: machines to expect (default: those offering resource modeld)."),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(help="serve: placement (default; where the model is warm) or round-robin."),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON document (for scripts).")
    ] = False,
) -> None:
    """Several daemons behind one HTTP front door on Ray Serve (needs modeld[ray])."""
    from modeld.cli import render
    from modeld.config import load_settings
    from modeld.errors import InvalidRequestError

    settings, _ = load_settings({"http": http or DEFAULT_HTTP})
    if action is ClusterAction.ps:
        given = [f"--{n}" for n, v in (("address", address), ("nodes", nodes),
                                       ("policy", policy)) if v is not None]
        if given:
            raise InvalidRequestError(f"{', '.join(given)}: only for modeld cluster serve",
                                      hint="modeld cluster ps takes --http and --json")
        render.emit("cluster_ps", ps_command(settings), as_json=json_out,
                    text=ps_text)
        return
    if policy not in (None, "placement", "round-robin"):
        raise InvalidRequestError(f"unknown --policy {policy!r}",
                                  hint="use placement or round-robin")
    got = serve_command(settings, address=address, nodes=nodes,
                                   policy=policy or "placement")
    if json_out:
        render.emit_json("cluster_serve", got)
    else:
        render.message(f"modeld: cluster front door at {got['url']} over {got['nodes']} "
                       f"node(s), {got['policy']} routing (stop it with `serve shutdown`)")


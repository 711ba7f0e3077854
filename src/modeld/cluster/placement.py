"""Which daemon serves a request for a model: pure policy, no Ray, no sockets.

Each daemon is described by a :class:`NodeView` built from its own ``show`` dry run for the
model (``plan``: what a load would do there now) and its ``ps`` (requests running and queued),
plus what the ingress itself has sent there and not yet seen finish. :func:`choose` ranks them:

0. the node that holds the model or is loading it (``plan`` ``loaded``, or requests for it in
   flight there: a load the daemon has not reported yet still counts), so a model stays where
   it is warm and concurrent first requests do not load it twice;
1. a node where it fits without evicting anything (``admit``);
2. a node where it fits by evicting idle models only (``evict``/``reload``; fewer victims first);
3. a node where it would have to wait for busy models to finish (``wait``);

and within a rank the least loaded node, then the name (deterministic). A node that is down,
that refuses the model (``refuse``: larger than its budget) or that could not plan it (an error:
the daemon does not know the name) is never chosen. :func:`round_robin` is the placement-blind
baseline the benchmark compares against (what a generic proxy does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

HOLDS, FITS, EVICTS_IDLE, WAITS = 0, 1, 2, 3
RANK_NAMES = {HOLDS: "holds it", FITS: "fits without evicting", EVICTS_IDLE: "evicts idle models",
              WAITS: "waits for busy models"}
_RANK_OF_PLAN = {"loaded": HOLDS, "admit": FITS, "evict": EVICTS_IDLE, "reload": EVICTS_IDLE,
                 "wait": WAITS}


@dataclass(frozen=True)
class NodeView:
    """One daemon as routing sees it at one moment."""

    name: str
    up: bool = True
    plan: str | None = None  # show's plan for the model; None: the daemon could not plan it
    would_evict: tuple[str, ...] = ()
    running: int = 0  # requests decoding on the daemon (all models)
    queued: int = 0  # requests waiting on the daemon (all models)
    sent: int = 0  # requests the ingress has in flight to this node (all models)
    sent_for_model: int = 0  # ... of them for this model
    error: str | None = field(default=None, compare=False)  # why plan is None

    @property
    def load(self) -> int:
        """Requests on this node: the daemon's count, or the ingress's when that is larger
        (the daemon has not seen them yet)."""
        return max(self.running + self.queued, self.sent)


@dataclass(frozen=True)
class Route:
    node: str
    rank: int
    reason: str


def rank(view: NodeView) -> int | None:
    """The node's rank for the model (lower is better), None when it cannot take it."""
    if not view.up:
        return None
    if view.sent_for_model > 0:
        return HOLDS
    if view.plan is None:
        return None
    return _RANK_OF_PLAN.get(view.plan)


def choose(views: Sequence[NodeView]) -> Route | None:
    """The best node for the model (see the module doc); None when no node can take it."""
    ranked = [(r, v) for v in views if (r := rank(v)) is not None]
    if not ranked:
        return None
    r, best = min(ranked, key=lambda rv: (rv[0], rv[1].load, len(rv[1].would_evict),
                                          rv[1].name))
    reason = RANK_NAMES[r]
    if r == EVICTS_IDLE:
        reason += f" ({', '.join(best.would_evict)})" if best.would_evict else ""
    return Route(best.name, r, f"{reason}, {best.load} request(s) there")


def least_loaded(views: Sequence[NodeView]) -> str | None:
    """The up node with the fewest requests (for requests that name no model, and to let a
    daemon answer a model no node can plan with its own error)."""
    up = [v for v in views if v.up]
    return min(up, key=lambda v: (v.load, v.name)).name if up else None


def round_robin(views: Sequence[NodeView], turn: int) -> str | None:
    """The ``turn``-th up node in name order, whatever it holds (the placement-blind
    baseline)."""
    up = sorted(v.name for v in views if v.up)
    return up[turn % len(up)] if up else None

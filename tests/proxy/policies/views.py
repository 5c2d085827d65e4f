"""Cluster views and turns for the anchor policies' tests: two Ps and two Ds, the session's
home P0 and D0."""

from __future__ import annotations

from proxy.live.cluster_view import ClusterView, NodeView
from proxy.policies.base import Turn
from proxy.shared.vocabulary import Role, Workload

P0, P1, D0, D1 = "http://p0", "http://p1", "http://d0", "http://d1"


def node(url: str, **fields: object) -> NodeView:
    """One node: a P if its URL says so, else a D."""
    role = Role.PREFILL if "//p" in url else Role.DECODE
    return NodeView(url, role, **fields)  # type: ignore[arg-type]


def view(*nodes: NodeView, home_prefill: str | None = P0,
         home_decode: str | None = D0) -> ClusterView:
    """The usable nodes given (by default P0, P1, D0, D1 with nothing known)."""
    nodes = nodes or (node(P0), node(P1), node(D0), node(D1))
    return ClusterView(tuple(nodes), home_prefill, home_decode)


def turn(n_ctx: int, n_in: int, cluster: ClusterView | None = None, number: int = 2,
         can_local: bool = True, session: str = "s", can_readback: bool = False) -> Turn:
    """Turn `number` of session `session` with n_ctx held tokens and n_in new ones."""
    workload = Workload(number, n_in, n_ctx if number > 1 else 0, 64, 1.0)
    return Turn(workload, session, can_local, can_readback=can_readback,
                view=cluster if cluster is not None else view())

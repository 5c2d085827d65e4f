"""Failover: one turn's tries over the nodes of a role, and the one rule for a failed leg.

docs/architecture.md: a request does not wait for the health checks. A leg that fails on a node
(refused, reset, timed out, 5xx, a read error before the first byte) is charged to that node
and the turn moves on to another node of the role; the router decides what is retried (a D
failure redoes the whole P->D turn, so D never gets kv_transfer_params twice). A node is never
tried twice for one request, so no node runs a completion twice: it may have received the
first one.

What a failure does to its node (`charge`), in one place: a refused connection means nothing
listens there, so the node is down at once (the health checks bring it back); any other
failure may be this request's alone, so it only counts toward the node's circuit breaker,
which takes the node out after several in a row.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.backends import Backend, BackendPool
from proxy.breaker import CircuitState
from proxy.errors import NoBackend, ProxyError, UpstreamError, UpstreamRefused, UpstreamTimeout
from proxy.lease import Lease
from proxy.metrics import ProxyMetrics
from proxy.vocabulary import Role

log = logging.getLogger("ppd.proxy")

T = TypeVar("T")
# The failures a node is charged with; anything else (NoBackend, a bug) is not the node's.
NodeFailure = (UpstreamError, UpstreamTimeout)


def charge(pool: BackendPool, lease: Lease, node: Backend, exc: ProxyError) -> None:
    """The rule for a node whose leg failed: down at once if it refused, else a breaker strike."""
    if isinstance(exc, UpstreamRefused):
        pool.mark(node.url, healthy=False)
    lease.settle(node, ok=False)


class Failover:
    """One request's failover state: the nodes it has given up on per role, its last failure."""

    def __init__(self, pool: BackendPool, lease: Lease, metrics: ProxyMetrics) -> None:
        self.pool = pool
        self.lease = lease
        self.metrics = metrics
        self.last: ProxyError | None = None
        self._excluded: defaultdict[Role, set[str]] = defaultdict(set)
        self._gave_up = False

    async def attempt(self, node: Backend, leg: Callable[[Backend], Awaitable[T]]) -> T | None:
        """`leg(node)` once, holding a slot on node; None when it failed (charged to node).

        The slot is held from the pick on (a D waiting for its P leg counts as busy, so
        concurrent turns spread over the Ds); the leg settles it once node has answered.
        """
        self.lease.hold(node)
        try:
            return await leg(node)
        except NodeFailure as exc:
            if self._gave_up:
                raise  # a leg nested in this one found no node left: not this node's failure
            log.warning("%s %s failed (%s); failing over", node.role, node.url, exc.message)
            self.metrics.upstream_error(node.role.value, exc.kind)
            self.metrics.failover(node.role.value)
            self.last = exc
            self._excluded[node.role].add(node.url)
            charge(self.pool, self.lease, node, exc)
            return None

    async def run(self, role: Role, prefer: str | None,
                  leg: Callable[[Backend], Awaitable[T]]) -> T:
        """`leg` on the preferred (else least-loaded) usable node of role, then on the next
        until one succeeds; when none is left, the last failure (or NoBackend) is raised."""
        while (node := self.pool.pick(role, prefer, frozenset(self._excluded[role]))) is not None:
            result = await self.attempt(node, leg)
            if result is not None:
                return result
        self._gave_up = True
        raise self.last or NoBackend(self._why_none(role))

    def _why_none(self, role: Role) -> str:
        nodes = self.pool.nodes(role)
        if not nodes:
            return f"no {role} node is registered"
        return f"no usable {role} node: " + "; ".join(
            f"{node.url} {self._why_not(node)}" for node in nodes)

    def _why_not(self, node: Backend) -> str:
        if node.url in self._excluded[node.role]:
            return "failed this request"
        if not node.healthy:
            return "is unhealthy"
        if self.pool.circuit_state(node) is CircuitState.OPEN:
            return f"has its circuit open after {node.circuit.failures} failures in a row"
        return "is half-open with its probe request in flight"

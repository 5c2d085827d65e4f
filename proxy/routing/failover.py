"""Failover: one turn's tries over the nodes of a role, and the rule for what a failed leg
costs its node.

docs/architecture.md: a request does not wait for the health checks. A leg that fails on a node
(refused, reset, timed out, 5xx, a read error before the first byte, a non-JSON answer) skips
that node for this request and the turn moves on to another node of the role; the router
decides what is retried (a D failure redoes the whole P->D turn, so D never gets
kv_transfer_params twice). A node is never tried twice for one request, so no node runs a
completion twice: it may have received the first one.

What a failure costs its node (the circuit breaker's strikes, `proxy.upstream.breaker`) is decided
once
the request is done with the role, because only then is it known whose fault it was:
- refused: nothing listens there; the node is down at once (the health checks bring it back);
- the request was then served by another node of the role: every node that failed it before
  gets a strike (the same request worked elsewhere, so the failure was the node's);
- it failed on every node tried: the request itself may be the cause (a prompt that trips an
  engine bug fails everywhere), so it counts at most once: one strike, on the first node that
  failed it, and none when that failure was a 5xx answer. vLLM (serve/exception_handling)
  answers 500 for an EngineGenerateError, which its own code says "could be request
  specific", while a dead engine (EngineDeadError) makes its /health answer 503, which the
  health checks act on: a 5xx that no other node contradicted proves nothing against a node.
So a client cannot lock everyone out by sending requests that make every D answer 500, while
a node that fails what the others serve, or that resets and times out, is still taken out.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TypeVar

from proxy.observability.metrics import ProxyMetrics
from proxy.shared.errors import (
    NoBackend,
    ProxyError,
    UpstreamError,
    UpstreamRefused,
    UpstreamStatus,
    UpstreamTimeout,
)
from proxy.shared.vocabulary import Role
from proxy.upstream.backends import Backend, BackendPool
from proxy.upstream.breaker import CircuitState
from proxy.upstream.deadline import Deadline
from proxy.upstream.lease import Lease

log = logging.getLogger("ppd.proxy")

T = TypeVar("T")
# The failures a node is charged with; anything else (NoBackend, a bug) is not the node's.
NodeFailure = (UpstreamError, UpstreamTimeout)


def charge(pool: BackendPool, lease: Lease, node: Backend, exc: ProxyError) -> None:
    """A strike for node, whose leg failed on its own (a stream cut after it started, where no
    other node can be tried); refused: the node is down at once."""
    if isinstance(exc, UpstreamRefused):
        pool.mark(node.url, healthy=False)
    lease.settle(node, ok=False)


class Failover:
    """One request's failover state: the nodes it gave up on per role, its last failure, and
    the failures whose cost is settled once the role's tries are over."""

    def __init__(self, pool: BackendPool, lease: Lease, metrics: ProxyMetrics,
                 deadline: Deadline | None = None) -> None:
        self.pool = pool
        self.lease = lease
        self.metrics = metrics
        self.deadline = deadline  # the whole request's (None: unbounded)
        self.last: ProxyError | None = None
        self._excluded: defaultdict[Role, set[str]] = defaultdict(set)
        self._failed: defaultdict[Role, list[tuple[Backend, ProxyError]]] = defaultdict(list)
        self._gave_up = False
        self._expired = False

    async def attempt(self, node: Backend, leg: Callable[[Backend], Awaitable[T]]) -> T | None:
        """`leg(node)` once, holding a slot on node; None when it failed (its cost is settled
        when the role's tries end: `run`, or `settle`).

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
            self._failure(node, exc)
            return None
        except asyncio.CancelledError:
            # The request's deadline (the router's timeout) cancels the innermost leg first.
            # It is counted as that node's timeout, but costs it no strike: the request's
            # budget ran out, and under load a healthy node may simply have been slow
            # (`make soak` on a loaded 2-core box: with a strike here, circuits opened and 146
            # and 413 requests of its two rounds were lost; without, 0 and 0). Its slot is
            # released without a verdict.
            if not self._expired and self.deadline is not None and self.deadline.expired:
                self._expired = True
                self.metrics.upstream_error(node.role.value, "timeout")
            raise

    def _failure(self, node: Backend, exc: ProxyError) -> None:
        self.last = exc
        self._excluded[node.role].add(node.url)
        if isinstance(exc, UpstreamRefused):
            self.pool.mark(node.url, healthy=False)
        self.lease.settle(node, ok=None)  # the slot is free; the verdict waits (`settle`)
        self._failed[node.role].append((node, exc))

    async def run(self, role: Role, prefer: str | None,
                  leg: Callable[[Backend], Awaitable[T]],
                  served: Callable[[T], bool] = lambda _: True) -> T:
        """`leg` on the preferred (else least busy) usable node of role, then on the next
        until one succeeds; when none is left, the last failure (or NoBackend) is raised.
        `served(result)`: whether the result proves the request servable (a 4xx does not)."""
        result: T | None = None
        try:
            while (node := self.pool.pick(role, prefer,
                                          frozenset(self._excluded[role]))) is not None:
                result = await self.attempt(node, leg)
                if result is not None:
                    return result
            self._gave_up = True
            raise self.last or NoBackend(self._why_none(role))
        finally:
            self.settle(role, served=result is not None and served(result))

    def settle(self, role: Role, served: bool) -> None:
        """What the request's failures on role cost their nodes (the module's rule)."""
        failures = self._failed.pop(role, [])
        # Served elsewhere: every failure was its node's. Failed everywhere: at most the first,
        # and not a 5xx answer.
        struck = failures if served else [f for f in failures[:1]
                                          if not isinstance(f[1], UpstreamStatus)]
        for node, _ in failures:
            if any(node is n for n, _ in struck):
                self.pool.failed(node)
            else:
                self.pool.abandoned(node)  # no verdict: a probe it was may be sent again

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

"""What one completion request holds, from admission until its body is done: a `Lease`.

A lease is the request's admission slot (the `--max-in-flight` gate) plus one in-flight slot on
every node a leg of it is running on. It is taken in one place (`Admission.admit`) and given
back in one place (`Lease.release`, idempotent), whatever path the request ends on: an
exception, a buffered answer, or the relay's close after the last streamed byte.

A node's slot ends early when its leg has a verdict (`settle`: the P leg answered, a D attempt
failed and the turn moves on); the verdict goes to the node's circuit breaker. A slot still
held at release ended without one (the client left), which the breaker counts as neither.
"""

from __future__ import annotations

from proxy.shared.errors import Overloaded
from proxy.upstream.backends import Backend, BackendPool


class Admission:
    """Open completion requests, against an optional limit (None: unlimited)."""

    def __init__(self, pool: BackendPool, limit: int | None = None) -> None:
        self.pool = pool
        self.limit = limit
        self.open = 0

    def admit(self) -> Lease:
        """A lease for one more request; Overloaded (429) when the limit is reached."""
        if self.limit is not None and self.open >= self.limit:
            raise Overloaded(f"the proxy is at its limit of {self.limit} open requests; "
                             "retry later")
        self.open += 1
        return Lease(self)


class Lease:
    """One request's admission slot and its node slots; `release` gives back what is held."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission
        self._nodes: list[Backend] = []

    @property
    def held(self) -> bool:
        """Whether this lease still holds its admission slot."""
        return self._admission is not None

    def hold(self, node: Backend) -> None:
        """Count a leg in flight on node until it is settled or the lease released."""
        if self._admission is None:
            raise RuntimeError("the lease was released or handed over")
        self._admission.pool.occupy(node)
        self._nodes.append(node)

    def settle(self, node: Backend, ok: bool | None) -> None:
        """The leg on node is over: free its slot and tell its breaker the verdict (None: the
        verdict comes later, from `proxy.routing.failover`).

        A no-op when node's slot is not held (already settled or released), so a verdict
        can never be counted twice.
        """
        if self._admission is None or node not in self._nodes:
            return
        self._nodes.remove(node)
        pool = self._admission.pool
        pool.vacate(node)
        if ok:
            pool.succeeded(node)
        elif ok is not None:
            pool.failed(node)

    def hand_over(self) -> Lease:
        """Move everything held to a new lease (the relay's); this one then holds nothing."""
        if self._admission is None:
            raise RuntimeError("the lease was released or handed over")
        successor = Lease(self._admission)
        successor._nodes = self._nodes
        self._admission, self._nodes = None, []
        return successor

    def release(self) -> None:
        """Give back every slot still held and the admission slot; later calls do nothing."""
        admission, nodes = self._admission, self._nodes
        if admission is None:
            return
        self._admission, self._nodes = None, []
        for node in nodes:
            admission.pool.vacate(node)
            admission.pool.abandoned(node)
        admission.open -= 1

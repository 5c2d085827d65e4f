"""What a policy may read of the cluster when it decides a turn: a frozen snapshot, no I/O.

A policy that declares `NEEDS = Needs(view=True)` (`proxy.policies.base`) gets one in
`Turn.view`; no other policy pays for building it. The proxy fills it from the pool (usable
nodes, its own in-flight counts), the nodes' /metrics gauges (`proxy.observability.node_gauges`,
trusted
while fresh) and residency from their KV events (`proxy.live.residency`): `proxy.live.view`. The
simulator fills the same fields from its engines (`profiler.simulator.cluster_state`), so a
policy runs unchanged in both. A field nothing has measured is None, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.shared.vocabulary import Role


@dataclass(frozen=True, slots=True)
class NodeView:
    """One usable node as a policy sees it now.

    in_flight: requests the proxy has sent there and not yet finished (its own count, exact
      for its own traffic); picks: times the pool has chosen it (its tie-breaker).
    running, waiting: vLLM's `num_requests_running` / `num_requests_waiting` gauges.
    kv_usage: the KV cache's used fraction in [0, 1]; kv_blocks x kv_block_size its capacity.
    held_tokens: leading tokens of this turn's prompt (the session's history) the node's
      prefix cache holds (D and R nodes; None on P and where residency does not know).
    """

    url: str
    role: Role
    in_flight: int = 0
    picks: int = 0
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    kv_blocks: int | None = None
    kv_block_size: int | None = None
    held_tokens: int | None = None

    @property
    def kv_tokens(self) -> int | None:
        """The KV cache's capacity in tokens (None unless both factors are known)."""
        if self.kv_blocks is None or self.kv_block_size is None:
            return None
        return self.kv_blocks * self.kv_block_size

    @property
    def busy(self) -> float:
        """Requests running there: the gauge when known, else the proxy's own in-flight count."""
        return self.running if self.running is not None else float(self.in_flight)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The usable nodes (healthy, circuit closed) in the pool's order, and the session's home:
    the P and the D (or replica) its last turn used, None for a new conversation. A home may
    be missing from `nodes` (it is down)."""

    nodes: tuple[NodeView, ...]
    home_prefill: str | None = None
    home_decode: str | None = None

    def usable(self, role: Role) -> tuple[NodeView, ...]:
        """The usable nodes of one role."""
        return tuple(node for node in self.nodes if node.role is role)

    def node(self, url: str | None) -> NodeView | None:
        """A usable node by URL (None: unknown or not usable now)."""
        return next((node for node in self.nodes if node.url == url), None)

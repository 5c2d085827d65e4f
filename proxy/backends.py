"""The backend pool: a ledger of nodes, their health and in-flight counts. No policy here.

Nodes come from the configuration (static) or from heartbeats (discovered; they leave the pool
when heartbeats stop). A new session gets the healthy node of the needed role with the fewest
requests in flight (ties: the node picked least often); afterwards it keeps its nodes while
they are healthy, so their prefix caches stay warm.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from proxy.config import NodeSpec
from proxy.route import Role


class Source(enum.StrEnum):
    """Where a node came from."""

    STATIC = "static"
    DISCOVERED = "discovered"


@dataclass(slots=True, eq=False)
class Backend:
    """One vLLM node as the proxy sees it."""

    url: str  # exactly as configured or registered (it is echoed in response headers)
    role: Role
    source: Source = Source.STATIC
    healthy: bool = True
    in_flight: int = 0
    models: tuple[str, ...] = ()
    zmq_address: str | None = None  # legacy P2pNccl registration
    last_seen: float = 0.0
    picks: int = 0

    @property
    def base(self) -> str:
        """The URL to append API paths to."""
        return self.url.rstrip("/")


class BackendPool:
    """All known nodes by URL."""

    def __init__(self, nodes: Iterable[NodeSpec] = ()) -> None:
        self._nodes: dict[str, Backend] = {}
        for node in nodes:
            self.add(node.url, node.role)

    def add(self, url: str, role: Role, *, source: Source = Source.STATIC,
            zmq_address: str | None = None, models: Iterable[str] | None = None,
            now: float = 0.0) -> Backend:
        """Add a node, or refresh it (a heartbeat from a known node also marks it healthy)."""
        node = self._nodes.get(url)
        if node is None or node.role is not role:
            node = Backend(url, role, source=source)
            self._nodes[url] = node
        node.last_seen = now
        node.zmq_address = zmq_address or node.zmq_address
        if models is not None:
            node.models = tuple(models)
        if source is Source.DISCOVERED:
            node.healthy = True
        return node

    def remove(self, url: str) -> bool:
        """Drop a node; its sessions are re-homed on their next turn."""
        return self._nodes.pop(url, None) is not None

    def get(self, url: str | None) -> Backend | None:
        """A node by URL."""
        return None if url is None else self._nodes.get(url)

    def nodes(self, role: Role | None = None) -> list[Backend]:
        """Every node (of a role)."""
        return [n for n in self._nodes.values() if role is None or n.role is role]

    def healthy(self, role: Role) -> list[Backend]:
        """Healthy nodes of a role."""
        return [n for n in self._nodes.values() if n.role is role and n.healthy]

    def is_usable(self, url: str | None, role: Role) -> bool:
        """Whether url is a healthy node of that role."""
        node = self.get(url)
        return node is not None and node.healthy and node.role is role

    def pick(self, role: Role, prefer: str | None = None,
             exclude: frozenset[str] = frozenset()) -> Backend | None:
        """The preferred node if usable, else the least-loaded healthy one (None: none left)."""
        if prefer is not None and prefer not in exclude and self.is_usable(prefer, role):
            node = self._nodes[prefer]
        else:
            candidates = [n for n in self.healthy(role) if n.url not in exclude]
            if not candidates:
                return None
            node = min(candidates, key=lambda n: (n.in_flight, n.picks))
        node.picks += 1
        return node

    def mark(self, url: str, healthy: bool) -> None:
        """Record a node's health (from a health check or a failed request)."""
        node = self._nodes.get(url)
        if node is not None:
            node.healthy = healthy

    @contextmanager
    def busy(self, node: Backend) -> Iterator[Backend]:
        """Count a request in flight on node for the duration of the block."""
        node.in_flight += 1
        try:
            yield node
        finally:
            node.in_flight -= 1

    def expire(self, now: float, timeout: float) -> list[str]:
        """Remove discovered nodes whose last heartbeat is older than timeout; their URLs."""
        gone = [n.url for n in self._nodes.values()
                if n.source is Source.DISCOVERED and n.last_seen + timeout < now]
        for url in gone:
            del self._nodes[url]
        return gone

    def models(self) -> set[str]:
        """Models any node lists (empty when no node reported a list)."""
        return {m for n in self._nodes.values() for m in n.models}

    def can_serve(self, roles: Iterable[Role]) -> bool:
        """Whether every role listed has a healthy node."""
        return all(self.healthy(role) for role in roles)

    def snapshot(self) -> list[dict[str, Any]]:
        """Every node as plain data (for /stats)."""
        return [{"url": n.url, "role": n.role.value, "source": n.source.value,
                 "healthy": n.healthy, "in_flight": n.in_flight, "models": list(n.models)}
                for n in self._nodes.values()]

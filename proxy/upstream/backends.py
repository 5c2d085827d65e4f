"""The backend pool: every node, with its health, circuit and in-flight count.

Nodes come from the configuration (static) or from heartbeats (discovered; they leave the pool
when heartbeats stop). A new session gets the usable node of the needed role with the fewest
requests in flight (ties: the node picked least often); afterwards it keeps its nodes while
they are usable, so their prefix caches stay warm. Usable: healthy (its /health answers) and
admitted by its circuit breaker (its completions do not keep failing); the breaker's rule lives
in `proxy.upstream.breaker`, the pool only keeps each node's `Circuit` and applies the rule.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from proxy.shared.vocabulary import Node, Role
from proxy.upstream.breaker import CLOSED, Breaker, Circuit, CircuitState

_DEFAULT_PORTS = {"http": 80, "https": 443}


@functools.lru_cache(maxsize=4096)
def node_key(url: str) -> tuple[str, str, int | None, str]:
    """What identifies the server a URL reaches: scheme, host, port and path, with every
    spelling of this host's loopback (`localhost`, `127.0.0.1`, `127.1`, any 127/8 address,
    `[::1]`, `0.0.0.0`, `[::]`) as one, IPv4 short forms written out, the scheme's default
    port explicit and trailing slashes dropped. Host names other than `localhost` are not
    resolved (that would block the event loop): a heartbeat naming a static node by another
    DNS name is a new node, still under the discovery token's protection."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        port = None
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:  # 127.1, 2130706433: forms the OS resolver accepts for IPv4
            address = ipaddress.IPv4Address(socket.inet_aton(host))
        except (OSError, UnicodeError):
            address = None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if host == "localhost" or (address is not None
                               and (address.is_loopback or address.is_unspecified)):
        host = "loopback"
    elif address is not None:
        host = str(address)
    return parts.scheme, host, port, parts.path.rstrip("/")


def same_node(a: str, b: str) -> bool:
    """Whether two URLs reach the same server (`node_key`)."""
    return node_key(a) == node_key(b)


class Source(enum.StrEnum):
    """Where a node came from."""

    STATIC = "static"
    DISCOVERED = "discovered"


@dataclass(slots=True, eq=False)
class Backend:
    """One vLLM node as the proxy sees it: the node, and what the pool keeps of it."""

    node: Node
    source: Source = Source.STATIC
    healthy: bool = True
    in_flight: int = 0
    models: tuple[str, ...] = ()
    zmq_address: str | None = None  # legacy P2pNccl registration
    last_seen: float = 0.0
    picks: int = 0
    circuit: Circuit = CLOSED

    @property
    def url(self) -> str:
        """Exactly as configured or registered (it is echoed in response headers)."""
        return self.node.url

    @property
    def role(self) -> Role:
        return self.node.role

    @property
    def base(self) -> str:
        """The URL to append API paths to."""
        return self.node.base


class BackendPool:
    """All known nodes by URL, with the breaker rule their circuits follow on `clock`."""

    def __init__(self, nodes: Iterable[Node] = (), breaker: Breaker | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.breaker = breaker or Breaker()
        self._clock = clock
        self._nodes: dict[str, Backend] = {}
        for node in nodes:
            self.add(node.url, node.role)

    def add(self, url: str, role: Role, *, source: Source = Source.STATIC,
            zmq_address: str | None = None, models: Iterable[str] | None = None,
            now: float = 0.0) -> Backend:
        """Add a node, or refresh it (a heartbeat from a known node also marks it healthy).

        A discovered node (a heartbeat) never changes a static one, whatever it claims: not
        its role, zmq address (where P2pNccl sends the KV), models, health or lifetime; the
        static node is returned unchanged. Its URL is matched however spelt (`node_key`), so a
        twin such as `http://localhost:PORT/` cannot slip in beside it either."""
        if source is Source.DISCOVERED and (static := self.static_twin(url)) is not None:
            return static
        node = self._nodes.get(url)
        if node is None or node.role is not role:
            node = Backend(Node(url, role), source=source)
            self._nodes[url] = node
        node.last_seen = now
        node.zmq_address = zmq_address or node.zmq_address
        if models is not None:
            node.models = tuple(models)
        if source is Source.DISCOVERED:
            node.healthy = True
        return node

    def static_twin(self, url: str) -> Backend | None:
        """The static node url names, however spelt (`same_node`), if any."""
        key = node_key(url)
        return next((n for n in self._nodes.values()
                     if n.source is Source.STATIC and node_key(n.url) == key), None)

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
        """Healthy nodes of a role (whatever their circuits say)."""
        return [n for n in self._nodes.values() if n.role is role and n.healthy]

    def is_usable(self, url: str | None, role: Role) -> bool:
        """Whether url is a healthy node of that role whose circuit admits a request now."""
        node = self.get(url)
        return (node is not None and node.healthy and node.role is role
                and self.breaker.admits(node.circuit, self._clock()))

    def pick(self, role: Role, prefer: str | None = None,
             exclude: frozenset[str] = frozenset()) -> Backend | None:
        """The preferred node if usable, else the least busy usable one (None: none left)."""
        node = self.candidate(role, prefer, exclude)
        return None if node is None else self._picked(node)

    def candidate(self, role: Role, prefer: str | None = None,
                  exclude: frozenset[str] = frozenset()) -> Backend | None:
        """The node `pick` would choose now, without picking it (what policy live reads)."""
        if prefer is not None and prefer not in exclude and self.is_usable(prefer, role):
            return self._nodes[prefer]
        now = self._clock()
        candidates = [n for n in self.healthy(role)
                      if n.url not in exclude and self.breaker.admits(n.circuit, now)]
        if not candidates:
            return None
        return min(candidates, key=lambda n: (n.in_flight, n.picks))

    def take(self, url: str, role: Role) -> Backend | None:
        """The node at url if it is usable for role now (then counted as picked), else None."""
        return self._picked(self._nodes[url]) if self.is_usable(url, role) else None

    def _picked(self, node: Backend) -> Backend:
        node.picks += 1
        # In half-open, the request this node was picked for is its circuit's probe.
        node.circuit = self.breaker.picked(node.circuit, self._clock())
        return node

    def mark(self, url: str, healthy: bool) -> None:
        """Record a node's health (from a health check or a refused connection)."""
        node = self._nodes.get(url)
        if node is not None:
            node.healthy = healthy

    def occupy(self, node: Backend) -> None:
        """One more request in flight on node (`proxy.upstream.lease` pairs it with `vacate`)."""
        node.in_flight += 1

    def vacate(self, node: Backend) -> None:
        """One request fewer in flight on node."""
        node.in_flight -= 1

    def succeeded(self, node: Backend) -> None:
        """A completion on node succeeded (its circuit closes)."""
        node.circuit = self.breaker.succeeded(node.circuit)

    def failed(self, node: Backend) -> None:
        """A completion on node failed (counted by its circuit breaker)."""
        node.circuit = self.breaker.failed(node.circuit, self._clock())

    def circuit_state(self, node: Backend) -> CircuitState:
        """Where node's circuit stands now."""
        return self.breaker.state(node.circuit, self._clock())

    def abandoned(self, node: Backend) -> None:
        """A request on node ended without a verdict (the client left)."""
        node.circuit = self.breaker.abandoned(node.circuit)

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
        """Whether every role listed has a node a request may go to now or after its probe:
        healthy, with its circuit not open (a half-open one is waiting for a request)."""
        now = self._clock()
        return all(any(self.breaker.state(n.circuit, now) is not CircuitState.OPEN
                       for n in self.healthy(role)) for role in roles)

    def snapshot(self) -> list[dict[str, Any]]:
        """Every node as plain data (for /stats, /health and the metrics)."""
        return [{"url": n.url, "role": n.role.value, "source": n.source.value,
                 "healthy": n.healthy, "in_flight": n.in_flight, "models": list(n.models),
                 "circuit": self.circuit_state(n).value,
                 "failures": n.circuit.failures}
                for n in self._nodes.values()]

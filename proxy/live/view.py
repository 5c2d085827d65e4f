"""The cluster as policies see it in the proxy: residency, /metrics and in-flight.

`LiveView.state(session)` assembles a `proxy.live.predict.TurnState` (policy live's reading) from
what the background tasks keep (`proxy.live.residency` fed by `proxy.live.kv_subscriber`,
`proxy.observability.node_gauges` scraping /metrics) and the pool's own in-flight counts; it does
no I/O,
so the router calls it on the request path. A reading older than `max_age` seconds is not
trusted: the node's batch is then the proxy's own in-flight count on it (exact for the
proxy's traffic, blind to anything else). The router also reports the streams it relays
(`streaming`/`done`) with their expected output, so the policy knows how much a delay to
each node's batch costs in TPOT.
`LiveView.cluster(session)` is `Turn.view` (`proxy.live.cluster_view`) of a policy that asks for
it (`Needs(view=True)`): every usable node with its gauges while fresh, and residency.

For residency to know a session, vLLM must tag the blocks it stores with the session:
vLLM >= 0.32 copies a request's `session_id` body field into its `BlockStored` events, so
the router sends the proxy's session id there (`tag_session`) on every leg of a live run.
An older vLLM ignores the field; its events carry no session and residency stays unknown
(the policy then assumes D holds what the session ledger says, as before).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.live.cluster_view import ClusterView, NodeView
from proxy.live.kv_subscriber import (
    DEFAULT_CLOCK_SKEW_S,
    KvEventSource,
    KvEventSubscribers,
    NodeSubscriber,
)
from proxy.live.predict import NodeState, TurnState
from proxy.live.residency import Residency
from proxy.observability.node_gauges import NodeGauges
from proxy.sessions.session import Session
from proxy.shared.vocabulary import Role
from proxy.upstream.backends import BackendPool

# vLLM's default --block-size, for a node whose events have not said theirs yet.
DEFAULT_BLOCK_SIZE = 16


def tag_session(body: dict[str, Any], session_id: str) -> dict[str, Any]:
    """A leg's body with vLLM's `session_id` field set (a new dict: bodies are never mutated)."""
    return {**body, "session_id": session_id}


class LiveView:
    """Reads the background signals into a TurnState for one session."""

    def __init__(self, pool: BackendPool, residency: Residency, signals: NodeGauges,
                 max_age: float) -> None:
        self.pool = pool
        self.residency = residency
        self.signals = signals
        self.max_age = max_age
        # Per node, the proxy's own streams decoding there: 1 / (n_out - 1) each, and the sum.
        self._streams: dict[str, dict[object, float]] = {}
        self._sums: dict[str, float] = {}

    def streaming(self, url: str, n_out: int) -> tuple[str, object]:
        """A reply started streaming from url: it is in that node's batch until `done`."""
        key = object()
        weight = 1.0 / max(n_out - 1, 1)
        self._streams.setdefault(url, {})[key] = weight
        self._sums[url] = self._sums.get(url, 0.0) + weight
        return url, key

    def done(self, token: tuple[str, object]) -> None:
        """The stream `streaming` returned token for has ended (whatever way)."""
        url, key = token
        weight = self._streams.get(url, {}).pop(key, None)
        if weight is not None:
            self._sums[url] = self._sums[url] - weight if self._streams[url] else 0.0

    def state(self, session: Session) -> TurnState:
        """The session's D, P and replica, each the one the pool would pick now (its own if
        usable, else the least busy); no replica when the pool has none usable."""
        decode = self.pool.candidate(Role.DECODE, session.decode)
        prefill = self.pool.candidate(Role.PREFILL, session.prefill)
        replica = self.pool.candidate(Role.REPLICA, session.decode)
        return TurnState(self._node(decode.url if decode else None, session.id),
                         self._node(prefill.url if prefill else None, session.id),
                         None if replica is None else self._node(replica.url, session.id))

    def cluster(self, session: Session) -> ClusterView:
        """Every usable node now (`Turn.view` of a policy that needs it): the pool's in-flight
        counts, the gauges while fresh, and for D and R nodes what residency says they hold of
        the session."""
        nodes = []
        for node in self.pool.nodes():
            if not self.pool.is_usable(node.url, node.role):
                continue
            reading = self.signals.get(node.url)
            age = self.signals.age(node.url)
            if reading is None or age is None or age > self.max_age:
                reading = None
            held = (None if node.role is Role.PREFILL
                    else self.residency.held_tokens(node.url, session.id))
            nodes.append(NodeView(
                node.url, node.role, node.in_flight, node.picks,
                reading.running if reading else None, reading.waiting if reading else None,
                reading.kv_usage if reading else None, reading.kv_blocks if reading else None,
                reading.kv_block_size if reading else None, held))
        return ClusterView(tuple(nodes), session.prefill, session.decode)

    def _node(self, url: str | None, session_id: str) -> NodeState:
        if url is None:
            return NodeState()
        held, block_size = self.residency.held(url, session_id)
        own = len(self._streams.get(url, ()))
        reading = self.signals.get(url)
        age = self.signals.age(url)
        free: int | None = None
        if reading is not None and age is not None and age <= self.max_age:
            running, waiting, free = reading.running, reading.waiting, reading.free_kv_tokens
        else:
            backend = self.pool.get(url)
            running, waiting = (float(backend.in_flight) if backend is not None else 0.0), 0.0
        # The batch's sum of 1/(n_out - 1): the proxy's own streams, scaled up to the batch
        # /metrics reports when other clients share the node; unknown without own streams.
        sensitivity = (self._sums[url] * max(1.0, running / own)) if own else None
        return NodeState(running, waiting, held, block_size, sensitivity, free)


class LiveRuntime:
    """The background half of policy live: one KV event subscriber per configured node and
    the /metrics scraper; `view` is what the router reads."""

    def __init__(self, pool: BackendPool, sources: tuple[KvEventSource, ...],
                 metrics_interval: float, clock: Callable[[], float],
                 kv_blocks: int | None = None,
                 kv_clock_skew: float = DEFAULT_CLOCK_SKEW_S) -> None:
        # Each node's index is bounded by its KV capacity: --kv-blocks, else its /metrics.
        self.residency = Residency(kv_blocks)
        self.signals = NodeGauges(clock)
        self.signals.listeners.append(
            lambda url, reading: self.residency.node_capacity(url, reading.kv_blocks))
        self.subscribers = KvEventSubscribers(
            [NodeSubscriber.joining(source, self.residency.node(source.url), kv_clock_skew)
             for source in sources])
        self.metrics_interval = metrics_interval
        # Three missed scrapes and a reading is too old to describe the node now.
        self.view = LiveView(pool, self.residency, self.signals, 3 * metrics_interval)
        self._pool = pool

    def start(self) -> None:
        self.subscribers.start()
        self.signals.start(lambda: [node.url for node in self._pool.nodes()],
                           self.metrics_interval)

    async def stop(self) -> None:
        await self.signals.stop()
        await self.subscribers.stop()

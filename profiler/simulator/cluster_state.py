"""What policies see of a simulated cluster: the proxy's view, read off the engines.

The proxy learns a node's batch and queue from its `/metrics` (`proxy.observability.node_gauges`)
and what it
still holds of a session from its KV cache events (`proxy.live.residency`). A simulated node is an
engine model, so the same numbers are read from it directly, at the decision's instant: the
running and waiting counts and the KV room vLLM's gauges report, the leading tokens of the
session's history its prefix cache (the LRU the events describe) holds, and the output
lengths of its running batch (which a proxy knows of the requests it sent). The D, P and
(hybrid pools) replica a turn would use are the ones the pool would pick: the session's own
if usable, else the least busy. `EngineView.cluster` is `Turn.view` (`proxy.live.cluster_view`) of a
policy that asks for it: every usable node, with the same fields the proxy fills.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from profiler.engine.engine import Engine
from profiler.engine.prefix_cache import ROOT_HASH, hash_block
from proxy.live.cluster_view import ClusterView, NodeView
from proxy.live.predict import NodeState, TurnState
from proxy.sessions.session import Session
from proxy.shared.vocabulary import Role
from proxy.upstream.backends import BackendPool

# Histories whose chains are kept for extension: more than the sessions in flight at once.
MAX_HELD_LISTS = 256


class HistoryHashes:
    """Block-hash chains of conversations' histories, extended as they grow (a history only
    ever appends, so each block is hashed once per conversation)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._chains: dict[str, list[int]] = {}
        # the token list each chain was made from, most recently used last: a chain is only
        # extended from its own list (a timed trace's next request under the session is
        # another list); the least recent past MAX_HELD_LISTS are let go, chain and all
        self._lists: dict[str, list[int]] = {}

    def chain(self, key: str, tokens: list[int]) -> list[int]:
        if self._lists.pop(key, None) is not tokens:
            self._chains[key] = []
        self._lists[key] = tokens
        if len(self._lists) > MAX_HELD_LISTS:
            oldest = next(iter(self._lists))
            del self._lists[oldest]
            self._chains.pop(oldest, None)
        chain = self._chains.setdefault(key, [])
        size = self.block_size
        parent = chain[-1] if chain else ROOT_HASH
        for start in range(len(chain) * size, len(tokens) - size + 1, size):
            parent = hash_block(parent, tokens[start:start + size])
            chain.append(parent)
        return chain

    def drop(self, key: str) -> None:
        self._chains.pop(key, None)
        self._lists.pop(key, None)


def node_state(engine: Engine | None, chain: Sequence[int] | None) -> NodeState:
    """A node's gauges and what it holds of a history's chain (unknown without an engine)."""
    if engine is None:
        return NodeState()
    stats = engine.stats()
    held = engine.cached_prefix_tokens(chain) if chain is not None else None
    sensitivity = sum(1.0 / max(n - 1, 1) for n in engine.running_output_lengths())
    blocks, block_size = engine.config.num_kv_blocks, engine.config.block_size
    return NodeState(float(stats.num_running), float(stats.num_waiting + stats.num_waiting_kv),
                     held, block_size, sensitivity,
                     round((1.0 - stats.kv_usage) * blocks * block_size))


class EngineView:
    """What the simulated proxy reads of its engines at a decision: `state` (a session's D and
    candidate P, `TurnState` for live) and `cluster` (every usable node, `Turn.view`)."""

    def __init__(self, engines: Mapping[str, Engine], pool: BackendPool,
                 history: Callable[[str], list[int] | None],
                 known_chain: Callable[[str], Sequence[int] | None] | None = None) -> None:
        """history: a session's context as token ids; known_chain: its block hashes at the
        engines' block size when the caller has them already (a recorded prompt's)."""
        self._engines = engines
        self._pool = pool
        self._history = history
        self._known_chain = known_chain
        sizes = {engine.config.block_size for engine in engines.values()}
        self._hashes = HistoryHashes(sizes.pop() if len(sizes) == 1 else 16)

    def _chain(self, session: Session) -> Sequence[int] | None:
        tokens = self._history(session.id)
        if tokens is None:
            self._hashes.drop(session.id)
            return None
        known = self._known_chain(session.id) if self._known_chain is not None else None
        if known is not None:
            return known
        return self._hashes.chain(session.id, tokens)

    def state(self, session: Session) -> TurnState:
        """The session's D and candidate P (and replica), as the pool would pick them now."""
        chain, pool, engines = self._chain(session), self._pool, self._engines
        decode = pool.candidate(Role.DECODE, session.decode)
        prefill = pool.candidate(Role.PREFILL, session.prefill)
        replica = pool.candidate(Role.REPLICA, session.decode)
        return TurnState(node_state(engines.get(decode.url) if decode else None, chain),
                         node_state(engines.get(prefill.url) if prefill else None, chain),
                         None if replica is None else node_state(engines[replica.url], chain))

    def cluster(self, session: Session) -> ClusterView:
        """Every usable node with the gauges vLLM would report and, on D and R nodes, the
        session's history its prefix cache holds (`proxy.live.view.LiveView.cluster`'s
        fields, read off the engines)."""
        chain = self._chain(session)
        nodes = []
        for node in self._pool.nodes():
            if not self._pool.is_usable(node.url, node.role):
                continue
            engine = self._engines.get(node.url)
            if engine is None:
                nodes.append(NodeView(node.url, node.role, node.in_flight, node.picks))
                continue
            stats, config = engine.stats(), engine.config
            held = (engine.cached_prefix_tokens(chain)
                    if chain is not None and node.role is not Role.PREFILL else None)
            nodes.append(NodeView(
                node.url, node.role, node.in_flight, node.picks, float(stats.num_running),
                float(stats.num_waiting + stats.num_waiting_kv), stats.kv_usage,
                config.num_kv_blocks, config.block_size, held))
        return ClusterView(tuple(nodes), session.prefill, session.decode)

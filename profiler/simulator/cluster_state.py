"""What `--policy live` sees of a simulated cluster: the proxy's view, read off the engines.

The proxy learns a node's batch and queue from its `/metrics` (`proxy.node_gauges`) and what it
still holds of a session from its KV cache events (`proxy.residency`). A simulated node is an
engine model, so the same numbers are read from it directly, at the decision's instant: the
running and waiting counts and the KV room vLLM's gauges report, the leading tokens of the
session's history its prefix cache (the LRU the events describe) holds, and the output
lengths of its running batch (which a proxy knows of the requests it sent). The D, P and
(hybrid pools) replica a turn would use are the ones the pool would pick: the session's own
if usable, else the least busy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from profiler.engine.engine import Engine
from profiler.engine.prefix_cache import ROOT_HASH, hash_block
from proxy.backends import BackendPool
from proxy.live import NodeState, TurnState
from proxy.sessions.session import Session
from proxy.vocabulary import Role


class HistoryHashes:
    """Block-hash chains of conversations' histories, extended as they grow (a history only
    ever appends, so each block is hashed once per conversation)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._chains: dict[str, list[int]] = {}

    def chain(self, key: str, tokens: list[int]) -> list[int]:
        chain = self._chains.setdefault(key, [])
        size = self.block_size
        parent = chain[-1] if chain else ROOT_HASH
        for start in range(len(chain) * size, len(tokens) - size + 1, size):
            parent = hash_block(parent, tokens[start:start + size])
            chain.append(parent)
        return chain

    def drop(self, key: str) -> None:
        self._chains.pop(key, None)


def node_state(engine: Engine | None, chain: list[int] | None) -> NodeState:
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


def observer(engines: Mapping[str, Engine], pool: BackendPool,
             history: Callable[[str], list[int] | None]) -> Callable[[Session], TurnState]:
    """The `observe` callback of `SimProxy`: a session's D and candidate P, now."""
    sizes = {engine.config.block_size for engine in engines.values()}
    hashes = HistoryHashes(sizes.pop() if len(sizes) == 1 else 16)

    def observe(session: Session) -> TurnState:
        tokens = history(session.id)
        chain = hashes.chain(session.id, tokens) if tokens is not None else None
        if tokens is None:
            hashes.drop(session.id)
        decode = pool.candidate(Role.DECODE, session.decode)
        prefill = pool.candidate(Role.PREFILL, session.prefill)
        replica = pool.candidate(Role.REPLICA, session.decode)
        return TurnState(node_state(engines.get(decode.url) if decode else None, chain),
                         node_state(engines.get(prefill.url) if prefill else None, chain),
                         None if replica is None else node_state(engines[replica.url], chain))

    return observe

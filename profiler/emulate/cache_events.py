"""An emulated node's prefix-cache changes as vLLM's KV cache events, one step's worth at a time.

The engine model tells a `profiler.engine.CacheObserver` of every block it stores and evicts;
`CacheEvents` is that observer. It turns them into `proxy.live.kv_events` events the way vLLM's
scheduler does: the new full blocks one request filled in a step become one `BlockStored`
(their hashes, the parent of the first, their token ids, the block size), tagged with the
request's `session_id` body field as vLLM >= 0.32 tags them (`proxy.live.residency` joins a
session's chain by that tag); an eviction becomes a `BlockRemoved`. `take()` hands the
step's events to the publisher (`kv_publisher.py`), in the order they happened.

The block hashes are the engine model's own chained ints (`prefix_cache.hash_block`), opaque
keys to a subscriber as vLLM's are; a first block's parent is sent as None, as vLLM sends it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from profiler.engine.prefix_cache import ROOT_HASH
from proxy.live.kv_events import BlockRemoved, BlockStored, KvEvent


@dataclass(slots=True)
class _Stored:
    """Consecutive blocks one request stored in this step (one BlockStored when taken)."""

    request_id: str
    session_id: str | None
    parent: int
    hashes: list[int]
    token_ids: list[int] = field(default_factory=list)

    def event(self, block_size: int) -> BlockStored:
        return BlockStored(tuple(self.hashes), None if self.parent == ROOT_HASH else self.parent,
                           len(self.token_ids), block_size, self.session_id,
                           tuple(self.token_ids))


class CacheEvents:
    """A CacheObserver that keeps one step's events, each store tagged with its session."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._sessions: dict[str, str] = {}  # request id -> its session_id field
        self._pending: list[_Stored | BlockRemoved] = []

    def tag(self, request_id: str, session_id: str) -> None:
        """Blocks the request stores are the session's (until `untag`)."""
        self._sessions[request_id] = session_id

    def untag(self, request_id: str) -> None:
        self._sessions.pop(request_id, None)

    def stored(self, block_hash: int, parent: int, token_ids: Sequence[int],
               request_id: str) -> None:
        last = self._pending[-1] if self._pending else None
        if isinstance(last, _Stored) and last.request_id == request_id \
                and last.hashes[-1] == parent:
            last.hashes.append(block_hash)
            last.token_ids.extend(token_ids)
            return
        self._pending.append(_Stored(request_id, self._sessions.get(request_id), parent,
                                     [block_hash], list(token_ids)))

    def removed(self, block_hashes: list[int]) -> None:
        self._pending.append(BlockRemoved(tuple(block_hashes)))

    def take(self) -> list[KvEvent]:
        """The events since the last take, oldest first (empty when the cache did not change)."""
        if not self._pending:
            return []
        events: list[KvEvent] = [item.event(self.block_size) if isinstance(item, _Stored)
                                 else item for item in self._pending]
        self._pending = []
        return events

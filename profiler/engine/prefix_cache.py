"""The KV cache's block accounting: a fixed number of blocks, a prefix cache of full blocks,
LRU eviction.

As in vLLM's KVCacheManager, a full block is identified by a hash chained over its parent's
hash and its token ids, so equal prefixes share blocks. A block whose last holder finishes
stays cached (evictable) until an allocation needs it; eviction takes the least recently
freed first, and a request's blocks are freed tail first so a prefix outlives its suffix.
The accounting knows nothing about scheduling: the scheduler decides who gets blocks.

An optional `CacheObserver` hears of every block that enters or leaves the cache - what vLLM
publishes as KV cache events (an emulated node does, `profiler.emulate.kv_publisher`). Without
one, nothing is computed for it: the simulator runs thousands of runs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Protocol

ROOT_HASH = 0


def hash_block(parent: int, token_ids: Sequence[int]) -> int:
    """The chained hash of one full block (deterministic across processes: ints only)."""
    return hash((parent, tuple(token_ids)))


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int = ROOT_HASH) -> list[int]:
    """Chained hashes of every full block of token_ids (a trailing partial block has none)."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes


class CacheObserver(Protocol):
    """Told when a block enters or leaves the cache (vLLM's BlockStored / BlockRemoved)."""

    def stored(self, block_hash: int, parent: int, token_ids: Sequence[int],
               request_id: str) -> None:
        """A full block became cached: its chained hash, its parent's (ROOT_HASH for a first
        block), its tokens (empty when the request gave block hashes only), who filled it."""
        ...

    def removed(self, block_hashes: list[int]) -> None:
        """Cached blocks were evicted to make room."""
        ...


class PrefixCache:
    """Block accounting. Hashed blocks are reference-counted; a hashed block with no holder is
    evictable; anonymous blocks (partial, or not hashable) are only counted.

    Stores are reported to the observer by the caller of `register` (only it knows a block's
    tokens and request); evictions by the cache itself."""

    def __init__(self, num_blocks: int, observer: CacheObserver | None = None) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.observer = observer
        self._free = num_blocks  # blocks holding nothing
        self._refs: dict[int, int] = {}  # resident hashed block -> holders
        self._evictable: OrderedDict[int, None] = OrderedDict()  # refs == 0, oldest first
        self.num_evictions = 0

    @property
    def num_available(self) -> int:
        """Blocks an allocation can get: free plus evictable."""
        return self._free + len(self._evictable)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's kv_cache_usage_perc, as a fraction)."""
        return 1.0 - self.num_available / self.num_blocks

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._refs

    def longest_prefix(self, hashes: Iterable[int]) -> int:
        """How many leading blocks of a hash chain are resident."""
        count = 0
        for block_hash in hashes:
            if block_hash not in self._refs:
                break
            count += 1
        return count

    def acquire(self, hashes: Iterable[int]) -> None:
        """Take a reference on resident blocks (a prefix hit); they stop being evictable."""
        for block_hash in hashes:
            self._refs[block_hash] += 1
            self._evictable.pop(block_hash, None)

    def allocate(self, count: int) -> bool:
        """Take `count` anonymous blocks, evicting cached blocks if needed; False (and no
        change) if there are not enough."""
        if count > self.num_available:
            return False
        from_free = min(count, self._free)
        self._free -= from_free
        evicted: list[int] | None = [] if self.observer is not None else None
        refs, pop_oldest = self._refs, self._evictable.popitem
        for _ in range(count - from_free):
            block_hash, _ = pop_oldest(last=False)
            del refs[block_hash]
            if evicted is not None:
                evicted.append(block_hash)
        self.num_evictions += count - from_free
        if evicted:
            assert self.observer is not None
            self.observer.removed(evicted)
        return True

    def register_all(self, hashes: Sequence[int]) -> None:
        """`register` for each of a request's newly full blocks, for a cache no observer
        hears (nothing to report per block): one pass, the simulator's hot path (a P->D
        request registers its whole prompt, ~750 blocks, when the KV arrives)."""
        refs, evictable = self._refs, self._evictable
        shared = 0
        for block_hash in hashes:
            holders = refs.get(block_hash)
            if holders is None:
                refs[block_hash] = 1
            else:  # the same content is resident: share it, free our copy (as `register`)
                refs[block_hash] = holders + 1
                evictable.pop(block_hash, None)
                shared += 1
        self._free += shared

    def register(self, block_hash: int) -> bool:
        """An anonymous block the caller holds became full with this hash. If the same content
        is already resident, the caller shares it and its own copy returns to the free pool.
        True iff the block is newly cached (a store an observer hears of)."""
        if block_hash in self._refs:
            self._free += 1
            self.acquire((block_hash,))
            return False
        self._refs[block_hash] = 1
        return True

    def reset(self) -> bool:
        """Forget every cached block, as vLLM's reset_prefix_cache does: only while no request
        holds a block (False, and no change, otherwise); the observer hears of each removal."""
        if self._free + len(self._evictable) != self.num_blocks:
            return False
        removed = list(self._evictable)
        self._evictable.clear()
        self._refs.clear()
        self._free = self.num_blocks
        if removed and self.observer is not None:
            self.observer.removed(removed)
        return True

    def release(self, hashes: Sequence[int], anonymous: int) -> None:
        """Drop a holder's blocks. Hashed blocks stay cached; the tail is evicted first."""
        self._free += anonymous
        refs, evictable = self._refs, self._evictable  # bound once: ~750 blocks a request
        for block_hash in reversed(hashes):
            holders = refs[block_hash] - 1
            refs[block_hash] = holders
            if holders == 0:
                evictable[block_hash] = None

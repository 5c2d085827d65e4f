"""PrefixCache.reset: vLLM's reset_prefix_cache - every cached block forgotten, refused while
any block is held."""

from __future__ import annotations

from collections.abc import Sequence

from profiler.engine.prefix_cache import PrefixCache


class Removals:
    """A CacheObserver that records removals."""

    def __init__(self) -> None:
        self.removed_list: list[int] = []

    def stored(self, block_hash: int, parent: int, token_ids: Sequence[int],
               request_id: str) -> None:
        pass

    def removed(self, block_hashes: list[int]) -> None:
        self.removed_list += block_hashes


def test_reset_forgets_cached_blocks_once_nothing_holds_them() -> None:
    observer = Removals()
    cache = PrefixCache(4, observer)
    assert cache.allocate(2)
    cache.register(11)
    cache.register(12)
    assert not cache.reset()  # a request holds both blocks: refused, nothing changes
    assert cache.is_cached(11) and cache.num_available == 2
    cache.release([11, 12], anonymous=0)
    assert cache.is_cached(11) and cache.num_available == 4  # cached, evictable
    assert cache.reset()
    assert not cache.is_cached(11) and not cache.is_cached(12)
    assert cache.longest_prefix([11, 12]) == 0 and cache.num_available == 4
    assert sorted(observer.removed_list) == [11, 12]  # the KV events a node publishes
    assert cache.reset()  # an empty cache resets too


def test_an_anonymous_block_in_use_also_refuses_the_reset() -> None:
    cache = PrefixCache(2)
    assert cache.allocate(1)
    assert not cache.reset()
    cache.release([], anonymous=1)
    assert cache.reset()

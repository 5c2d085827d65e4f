"""A request that brings its prompt's block hashes (`Request.prompt_hashes`) runs exactly as
one the engine hashes itself; hashes of another block size are refused. And the prefix
cache's one-pass `register_all` keeps the same books as `register` block by block."""

from __future__ import annotations

import pytest

from profiler.engine import Engine, EngineConfig, Request, simulate
from profiler.engine.prefix_cache import PrefixCache, block_hashes


def _engine(cost) -> Engine:
    # few blocks: the second wave of requests evicts the first's
    return Engine(EngineConfig(block_size=4, num_kv_blocks=24, max_num_batched_tokens=16), cost)


def _requests(hashed: bool) -> list[tuple[float, Request]]:
    shared = list(range(1000, 1010))  # two full blocks and a partial one, in every prompt
    prompts = [shared + list(range(n * 100, n * 100 + 7 + n)) for n in range(6)]
    return [(0.004 * n, Request(f"r{n}", max_tokens=3 + n, prompt_token_ids=ids,
                                prompt_hashes=tuple(block_hashes(ids, 4)) if hashed else None))
            for n, ids in enumerate(prompts)]


def test_given_prompt_hashes_change_nothing(cost) -> None:
    hashing, given = _engine(cost), _engine(cost)
    expected = simulate(hashing, _requests(hashed=False))
    result = simulate(given, _requests(hashed=True))
    assert {rid: (o.token_times, o.num_cached_prompt) for rid, o in result.outcomes.items()} \
        == {rid: (o.token_times, o.num_cached_prompt) for rid, o in expected.outcomes.items()}
    assert given.stats() == hashing.stats()
    assert given.stats().prefix_cache_hits > 0  # the shared blocks were hit


def test_prompt_hashes_of_another_block_size_are_refused(cost) -> None:
    ids = list(range(32))
    with pytest.raises(ValueError, match="hashed at another block size"):
        _engine(cost).submit(Request("a", max_tokens=1, prompt_token_ids=ids,
                                     prompt_hashes=tuple(block_hashes(ids, 16))), now=0.0)
    with pytest.raises(ValueError, match="give both"):
        Request("b", max_tokens=1, prompt_len=8, block_hashes=(1, 2), prompt_hashes=(1, 2))


def _books(cache: PrefixCache) -> tuple[int, dict[int, int], list[int]]:
    return cache.num_available, dict(cache._refs), list(cache._evictable)


def test_register_all_keeps_the_books_register_keeps() -> None:
    one_by_one, at_once = PrefixCache(10), PrefixCache(10)
    for cache in (one_by_one, at_once):
        assert cache.allocate(3)
        for block in (1, 2, 3):
            cache.register(block)
        cache.release([1, 2, 3], anonymous=0)  # cached, evictable: 3, then 2, then 1
        assert cache.allocate(4)
    for block in (2, 7, 3, 8):  # two of them resident already: shared, their copies freed
        one_by_one.register(block)
    at_once.register_all([2, 7, 3, 8])
    assert _books(at_once) == _books(one_by_one)
    assert _books(at_once)[2] == [1]  # 2 and 3 are held again; only 1 is evictable

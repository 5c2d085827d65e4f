"""Token ids made from block hashes: equal hashes equal blocks, scaled lengths."""

from __future__ import annotations

import pytest

from profiler.traces.block_tokens import DISTINCT_BASE, FIRST_TOKEN_ID, BlockTokens
from profiler.traces.mooncake import BLOCK_TOKENS, BlockRecord


def record(hashes: tuple[int, ...], partial: int = BLOCK_TOKENS) -> BlockRecord:
    return BlockRecord(0, 0.0, (len(hashes) - 1) * BLOCK_TOKENS + partial, 10, hashes)


def test_equal_hashes_give_equal_blocks_and_different_hashes_different_ones() -> None:
    tokens = BlockTokens(vocab_size=3072)
    a, b = tokens.prompt(record((0, 1, 2))), tokens.prompt(record((0, 1, 3)))
    assert len(a) == len(b) == 3 * BLOCK_TOKENS
    assert a[:2 * BLOCK_TOKENS] == b[:2 * BLOCK_TOKENS]
    assert a[2 * BLOCK_TOKENS:] != b[2 * BLOCK_TOKENS:]
    assert all(FIRST_TOKEN_ID <= t < 3072 for t in a)


@pytest.mark.parametrize("vocab_size", [3072, None])
def test_deterministic_across_instances_and_seeded(vocab_size: int | None) -> None:
    assert BlockTokens(vocab_size).block(7) == BlockTokens(vocab_size).block(7)
    assert BlockTokens(vocab_size, seed=1).block(7) != BlockTokens(vocab_size).block(7)


def test_without_a_vocabulary_every_block_has_its_own_ids() -> None:
    tokens = BlockTokens()  # the simulator's: ids above any vocabulary and fresh token
    a, b = tokens.prompt(record((0, 1, 2))), tokens.prompt(record((0, 1, 3)))
    assert a[:2 * BLOCK_TOKENS] == b[:2 * BLOCK_TOKENS]
    assert not set(a[2 * BLOCK_TOKENS:]) & set(b)
    assert min(a) >= DISTINCT_BASE > 1 << 40 and len(set(a)) == len(a)


def test_the_partial_last_block_is_the_head_of_its_block() -> None:
    tokens = BlockTokens()
    prompt = tokens.prompt(record((0, 5), partial=100))
    assert len(prompt) == BLOCK_TOKENS + 100 and prompt[BLOCK_TOKENS:] == tokens.block(5)[:100]


def test_scaled_prompts_keep_the_block_structure() -> None:
    tokens = BlockTokens(vocab_size=3072, scale=0.1)
    assert tokens.block_size == 51 and tokens.scaled(343) == 34 and tokens.scaled(2) == 1
    a = tokens.prompt(record((0, 1, 2), partial=256))
    b = tokens.prompt(record((0, 1, 9, 4)))
    assert len(a) == 2 * 51 + 26 and len(b) == 4 * 51
    assert a[:102] == b[:102] and a[102:] != b[102:128]


@pytest.mark.parametrize("kwargs, message", [({"scale": 0}, "--scale-tokens"),
                                             ({"scale": 2}, "--scale-tokens"),
                                             ({"vocab_size": 50}, "vocabulary size")])
def test_bad_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BlockTokens(**kwargs)

"""Token ids made from block hashes: equal hashes equal blocks, scaled lengths, and a
continuation that extends its parent's prompt."""

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


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_a_continuation_is_its_parents_exact_prompt_then_its_own_ids(scale: float) -> None:
    tokens = BlockTokens(vocab_size=3072, scale=scale)
    size = tokens.block_size
    parent = tokens.prompt(record((0, 1, 2), partial=300))  # 2 complete blocks + a partial
    child = record((0, 1, 7, 8, 9), partial=200)  # the parent's reply lies in block 7
    prompt = tokens.continuation(child, parent)
    own = tokens.prompt(child)
    assert len(prompt) == len(own) > len(parent) and prompt[:len(parent)] == parent
    # The parent's partial tail (block 2's head) fills block 7's place up to the parent's
    # length; block 7's own rest, and blocks 8 and 9 where any prompt with them has them.
    assert prompt[2 * size:len(parent)] == tokens.block(2)[:len(parent) - 2 * size]
    assert prompt[len(parent):3 * size] == tokens.block(7)[len(parent) - 2 * size:]
    assert prompt[3 * size:4 * size] == tokens.block(8) == own[3 * size:4 * size]
    # The turn after it extends it in turn, mixed block and all.
    grandchild = tokens.continuation(record((0, 1, 7, 8, 9, 4)), prompt)
    assert grandchild[:len(prompt)] == prompt and len(grandchild) == 6 * size


def test_a_continuation_no_longer_than_its_parent_still_adds_an_id() -> None:
    tokens = BlockTokens()
    parent = tokens.prompt(record((0, 1, 2), partial=400))
    child = record((0, 1, 5), partial=100)  # shorter than the parent in the trace itself
    prompt = tokens.continuation(child, parent)
    assert prompt[:-1] == parent and prompt[-1] in tokens.block(5)
    assert len(prompt) == len(parent) + 1


@pytest.mark.parametrize("kwargs, message", [({"scale": 0}, "--scale-tokens"),
                                             ({"scale": 2}, "--scale-tokens"),
                                             ({"vocab_size": 50}, "vocabulary size")])
def test_bad_settings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BlockTokens(**kwargs)

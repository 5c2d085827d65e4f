"""The residency index: leading tokens of a session a node still holds."""

from __future__ import annotations

from proxy.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from proxy.residency import NodeResidency, Residency


def stored(hashes: list[int], parent: int | None, session: str | None = "s",
           block_size: int = 16) -> BlockStored:
    return BlockStored(tuple(hashes), parent, len(hashes) * block_size, block_size, session)


def test_unknown_until_the_session_is_stored() -> None:
    node = NodeResidency()
    assert node.held_tokens("s") is None
    node.apply(stored([1, 2, 3], None))
    assert node.held_tokens("s") == 48
    assert node.held_tokens("other") is None


def test_a_later_turn_extends_the_chain_and_eviction_cuts_the_leading_run() -> None:
    node = NodeResidency()
    node.apply(stored([1, 2], None))
    node.apply(stored([3, 4], 2))  # turn 2 appends after block 2
    assert node.held_tokens("s") == 64
    node.apply(BlockRemoved((4,)))  # vLLM evicts the tail first
    assert node.held_tokens("s") == 48
    node.apply(BlockRemoved((2,)))  # a hole: only the blocks before it count
    assert node.held_tokens("s") == 16
    node.apply(stored([2], 1))  # stored again by the next turn
    assert node.held_tokens("s") == 32


def test_shared_prefix_stored_under_another_session_is_joined() -> None:
    node = NodeResidency()
    node.apply(stored([1, 2], None, session="first"))
    node.apply(stored([5], 2, session="second"))  # blocks 1, 2 were a prefix-cache hit
    assert node.held_tokens("second") == 48
    node.apply(BlockRemoved((1,)))
    assert node.held_tokens("second") == 0
    assert node.held_tokens("first") == 0


def test_untagged_events_keep_blocks_but_no_session() -> None:
    node = NodeResidency()
    node.apply(stored([1, 2], None, session=None))
    assert node.num_blocks == 2 and node.held_tokens("s") is None


def test_clear_drops_every_block_and_forget_makes_sessions_unknown() -> None:
    node = NodeResidency()
    node.apply(stored([1, 2], None))
    node.apply(AllBlocksCleared())
    assert node.held_tokens("s") == 0 and node.num_blocks == 0
    node.apply(stored([1, 2], None))
    node.forget()
    assert node.held_tokens("s") is None and node.resets == 1
    # After a reset a chain whose start was before it cannot be placed: still unknown.
    node.apply(stored([3], 2))
    assert node.held_tokens("s") is None


def test_session_bound_forgets_the_oldest() -> None:
    node = NodeResidency(max_sessions=2)
    for i, session in enumerate("abc"):
        node.apply(stored([i * 10], None, session=session))
    assert node.held_tokens("a") is None and node.held_tokens("c") == 16


def test_residency_by_node_url() -> None:
    residency = Residency()
    residency.node("http://d0").apply(stored([1], None))
    assert residency.held_tokens("http://d0", "s") == 16
    assert residency.held_tokens("http://d1", "s") is None
    assert residency.held_tokens(None, "s") is None

"""The residency index: leading tokens of a session a node still holds, from an event stream
that may be hostile (cycles, floods, impossible sizes): bounded, cycle-safe, and in agreement
with a simple reference model on honest streams."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.live.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from proxy.live.residency import (
    BLOCK_BYTES,
    MAX_BLOCK_SIZE,
    SESSION_BYTES,
    NodeResidency,
    Rejection,
    Residency,
)


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


# -- the stream as untrusted input (docs/robustness.md, "KV events") -------------------------

def test_a_block_that_is_its_own_parent_is_rejected_and_forgets_the_node() -> None:
    node = NodeResidency()
    node.apply(stored([1, 2], None, session="kept"))
    assert node.apply(stored([7], 7)) is Rejection.CYCLE
    assert node.rejected[Rejection.CYCLE] == 1 and node.resets == 1
    assert node.held_tokens("kept") is None  # unknown, as after a gap
    node.apply(stored([1, 2], None, session="kept"))  # consistent again: known again
    assert node.held_tokens("kept") == 32


def test_a_two_block_parent_cycle_is_rejected() -> None:
    node = NodeResidency()
    assert node.apply(stored([1], 2, session=None)) is None  # parent never seen: an orphan
    assert node.apply(stored([2], 1, session=None)) is Rejection.CYCLE
    node.apply(stored([3], 1, session="s"))  # what the probe sent next: no hang, unknown
    assert node.held_tokens("s") is None
    assert node.apply(stored([4, 5, 4], None)) is Rejection.CYCLE  # a block twice in one event


def test_a_chain_longer_than_the_capacity_is_rejected() -> None:
    node = NodeResidency(capacity=100)
    node.apply(stored(list(range(1, 101)), None))
    assert node.held_tokens("s") == 100 * 16
    assert node.apply(stored([101], 100)) is Rejection.TOO_LONG
    assert node.held_tokens("s") is None and node.num_blocks == 0


def test_a_known_block_under_another_parent_is_rejected() -> None:
    node = NodeResidency()
    node.apply(stored([1, 2], None))
    assert node.apply(stored([2], 9, session=None)) is Rejection.PARENT_CONFLICT


def test_impossible_block_sizes_are_rejected() -> None:
    node = NodeResidency()
    assert node.apply(BlockStored((1,), None, 16, MAX_BLOCK_SIZE + 1)) is Rejection.BLOCK_SIZE
    assert node.apply(BlockStored((1,), None, 17, 16)) is Rejection.BLOCK_SIZE  # 17 in 16
    assert node.rejected[Rejection.BLOCK_SIZE] == 2


def test_a_long_chain_is_extended_and_forked_without_copies() -> None:
    node = NodeResidency()
    node.apply(stored([0], None, session="chain"))
    for block in range(1, 20_000):  # one block per event, as the probe sent
        node.apply(stored([block], block - 1, session="chain"))
    assert node.held_tokens("chain") == 20_000 * 16
    for fork in range(2_000):  # sessions forking from the tip share the chain
        node.apply(stored([100_000 + fork], 19_999, session=f"fork{fork}"))
    assert node.held_tokens("fork1999") == 20_001 * 16
    assert node.memory_bytes() < 25_000 * BLOCK_BYTES + 2_001 * SESSION_BYTES
    node.apply(BlockRemoved((10_000,)))
    assert node.held_tokens("fork7") == 10_000 * 16 and node.held_tokens("chain") == 10_000 * 16


def test_the_index_is_bounded_by_the_capacity_oldest_evicted_first() -> None:
    node = NodeResidency(capacity=1_000)
    for block in range(10_000):
        node.apply(stored([block], None, session=f"s{block}"))
    assert node.num_blocks == 1_000 and node.evicted == 9_000
    assert node.num_sessions <= 1_000
    assert node.held_tokens("s9999") == 16  # the newest is resident
    assert node.held_tokens("s0") is None  # the oldest session was forgotten
    assert node.memory_bytes() <= 2_000 * BLOCK_BYTES + 1_000 * SESSION_BYTES


def test_an_over_capacity_chain_loses_its_tail_first() -> None:
    node = NodeResidency(capacity=4)
    node.apply(stored([1, 2, 3], None, session="a"))
    node.apply(stored([4, 5], None, session="b"))  # one of a's blocks must go: its tail
    assert node.held_tokens("a") == 32 and node.held_tokens("b") == 32


def test_a_lower_capacity_from_the_node_evicts_at_once() -> None:
    residency = Residency()
    node = residency.node("http://d0")
    node.apply(stored(list(range(1, 11)), None))
    residency.node_capacity("http://d0", 5)
    assert node.capacity == 5 and node.num_blocks == 5
    fixed = Residency(capacity=8)  # --kv-blocks wins over /metrics
    fixed.node("http://d0")
    fixed.node_capacity("http://d0", 5)
    assert fixed.node("http://d0").capacity == 8


# -- property tests: random streams against a reference model ---------------------------------

class ReferenceResidency:
    """The simplest correct model: every block ever stored, unbounded, walked with a visited
    set; what `NodeResidency` must agree with while nothing was rejected or over capacity."""

    def __init__(self) -> None:
        self.parent: dict[int, int | None] = {}
        self.resident: set[int] = set()
        self.sessions: dict[str, tuple[int, int]] = {}  # session -> (tip, block size)

    def apply(self, event: KvEvent) -> None:
        if isinstance(event, BlockStored):
            link = event.parent
            for block in event.block_hashes:
                self.parent[block] = link  # type: ignore[index]
                self.resident.add(block)  # type: ignore[arg-type]
                link = block
            if event.session_id is not None and event.block_hashes:
                size = max(1, event.num_tokens // len(event.block_hashes))
                self.sessions[event.session_id] = (event.block_hashes[-1], size)  # type: ignore[assignment]
        elif isinstance(event, BlockRemoved):
            self.resident.difference_update(event.block_hashes)  # type: ignore[arg-type]
        else:
            self.resident.clear()

    def held_tokens(self, session: str) -> int | None:
        if session not in self.sessions:
            return None
        tip, size = self.sessions[session]
        chain: list[int] = []
        block: int | None = tip
        while block is not None:
            assert block not in chain
            chain.append(block)
            block = self.parent[block]
        chain.reverse()
        held = 0
        for block in chain:
            if block not in self.resident:
                break
            held += 1
        return held * size


@st.composite
def honest_streams(draw: st.DrawFn) -> list[KvEvent]:
    """What a vLLM node sends: new blocks under a known parent (or none), tagged or not;
    removals of what it holds; clears; blocks stored again under their own parent."""
    events: list[KvEvent] = []
    parent_of: dict[int, int | None] = {}
    next_hash = 1
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from(["store", "store", "store", "remove", "restore", "clear"]))
        known = sorted(parent_of)
        if kind == "store":
            parent = draw(st.none() | st.sampled_from(known)) if known else None
            count = draw(st.integers(1, 4))
            blocks = tuple(range(next_hash, next_hash + count))
            next_hash += count
            link = parent
            for block in blocks:
                parent_of[block] = link
                link = block
            session = draw(st.none() | st.sampled_from(["a", "b", "c", "d"]))
            events.append(BlockStored(blocks, parent, count * 16, 16, session))
        elif kind == "remove" and known:
            events.append(BlockRemoved(tuple(draw(st.lists(st.sampled_from(known),
                                                            min_size=1, max_size=3)))))
        elif kind == "restore" and known:
            block = draw(st.sampled_from(known))
            events.append(BlockStored((block,), parent_of[block], 16, 16, None))
        elif kind == "clear":
            events.append(AllBlocksCleared())
    return events


@settings(max_examples=100, deadline=None)
@given(honest_streams())
def test_an_honest_stream_agrees_with_the_reference_model(events: list[KvEvent]) -> None:
    node, reference = NodeResidency(), ReferenceResidency()
    for event in events:
        assert node.apply(event) is None
        reference.apply(event)
        for session in "abcd":
            assert node.held_tokens(session) == reference.held_tokens(session)


hashes = st.integers(0, 12)  # few values: cycles, self-parents and conflicts are common


@st.composite
def hostile_streams(draw: st.DrawFn) -> list[KvEvent]:
    """Anything the wire format can carry: any hashes, parents, sizes and tags."""
    events: list[KvEvent] = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["store", "store", "store", "remove", "clear"]))
        if kind == "store":
            blocks = tuple(draw(st.lists(hashes, min_size=0, max_size=5)))
            size = draw(st.sampled_from([1, 16, MAX_BLOCK_SIZE + 1]))
            tokens = len(blocks) * size + draw(st.sampled_from([0, 0, 0, 1]))
            events.append(BlockStored(blocks, draw(st.none() | hashes), tokens, size,
                                      draw(st.none() | st.sampled_from(["a", "b", "c"]))))
        elif kind == "remove":
            events.append(BlockRemoved(tuple(draw(st.lists(hashes, max_size=4)))))
        else:
            events.append(AllBlocksCleared())
    return events


@settings(max_examples=120, deadline=None)
@given(hostile_streams(), st.integers(1, 8), st.integers(1, 4))
def test_a_hostile_stream_stays_within_bounds(events: list[KvEvent], capacity: int,
                                              max_sessions: int) -> None:
    node = NodeResidency(capacity=capacity, max_sessions=max_sessions)
    for event in events:
        node.apply(event)
        assert node.num_blocks <= capacity
        assert node.memory_bytes() <= 2 * capacity * BLOCK_BYTES + max_sessions * SESSION_BYTES
        assert node.num_sessions <= min(capacity, max_sessions)
        for session in "abc":
            held = node.held_tokens(session)  # ends (depths strictly fall), never raises
            assert held is None or 0 <= held <= capacity * MAX_BLOCK_SIZE

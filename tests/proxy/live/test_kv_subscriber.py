"""The KV event subscriber against a fake vLLM publisher on loopback (real ZMQ)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import zmq.asyncio

from proxy.live.kv_events import BlockRemoved, BlockStored
from proxy.live.kv_subscriber import KvEventSource, KvEventSubscribers, NodeSubscriber
from proxy.live.residency import NodeResidency
from tests.fakes.fake_kv_publisher import FakeKvPublisher


def stored(hashes: list[int], parent: int | None, session: str = "s") -> BlockStored:
    return BlockStored(tuple(hashes), parent, 16 * len(hashes), 16, session)


@pytest.fixture(params=[False, True], ids=["map", "positional"])
def publisher(request: pytest.FixtureRequest) -> Iterator[FakeKvPublisher]:
    pub = FakeKvPublisher(replay=True, positional=request.param)
    yield pub
    pub.close()


async def wait_for(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


async def connected(pub: FakeKvPublisher, sub: NodeSubscriber) -> None:
    """PUB drops what it sends before SUB joined: publish a probe until one arrives."""
    probe = 0
    while sub.stats.batches == 0:
        pub.publish([stored([10_000 + probe], None, session="probe")])
        probe += 1
        await asyncio.sleep(0.02)


async def test_events_fold_into_the_index(publisher: FakeKvPublisher) -> None:
    session_tagged = not publisher.positional  # positional events carry no session_id
    index = NodeResidency()
    sub = NodeSubscriber(KvEventSource("http://d0", publisher.endpoint), index)
    subs = KvEventSubscribers([sub])
    subs.start()
    try:
        await connected(publisher, sub)
        publisher.publish([stored([1, 2, 3], None)])
        publisher.publish([BlockRemoved((3,))])
        await wait_for(lambda: sub.stats.last_seq == publisher.seq - 1)
        assert index.held_tokens("s") == (32 if session_tagged else None)
        assert index.is_resident(1) and not index.is_resident(3)
        assert sub.stats.gaps == 0
    finally:
        await subs.stop()


async def test_a_gap_is_replayed(publisher: FakeKvPublisher) -> None:
    index = NodeResidency()
    sub = NodeSubscriber(KvEventSource("http://d0", publisher.endpoint,
                                       publisher.replay_endpoint), index)
    subs = KvEventSubscribers([sub])
    subs.start()
    try:
        await connected(publisher, sub)
        publisher.publish([stored([1, 2], None)], drop=True)  # missed on the live stream
        publisher.publish([stored([3], 2)])
        await wait_for(lambda: sub.stats.last_seq == publisher.seq - 1)
        assert sub.stats.gaps == 1 and sub.stats.replayed >= 1 and sub.stats.resets == 0
        assert index.is_resident(1) and index.is_resident(3)
        if not publisher.positional:
            assert index.held_tokens("s") == 48
    finally:
        await subs.stop()


async def test_a_gap_without_replay_forgets_the_index() -> None:
    publisher = FakeKvPublisher()
    index = NodeResidency()
    sub = NodeSubscriber(KvEventSource("http://d0", publisher.endpoint), index)
    subs = KvEventSubscribers([sub])
    subs.start()
    try:
        await connected(publisher, sub)
        publisher.publish([stored([1, 2], None)])
        await wait_for(lambda: index.held_tokens("s") == 32)
        publisher.publish([BlockRemoved((2,))], drop=True)
        publisher.publish([stored([7], None, session="t")])
        await wait_for(lambda: sub.stats.last_seq == publisher.seq - 1)
        assert sub.stats.gaps == 1 and sub.stats.resets == 1
        assert index.held_tokens("s") is None  # unknown: today's behaviour
        assert index.held_tokens("t") == 16  # stored after the gap: known again
    finally:
        await subs.stop()
        publisher.close()


async def test_replay_that_no_longer_holds_the_gap_forgets() -> None:
    publisher = FakeKvPublisher(replay=True, buffer=1)
    index = NodeResidency()
    sub = NodeSubscriber(KvEventSource("http://d0", publisher.endpoint,
                                       publisher.replay_endpoint), index)
    subs = KvEventSubscribers([sub])
    subs.start()
    try:
        await connected(publisher, sub)
        publisher.publish([stored([1, 2], None)])
        await wait_for(lambda: index.held_tokens("s") == 32)
        publisher.publish([BlockRemoved((2,))], drop=True)
        publisher.publish([BlockRemoved((1,))], drop=True)  # pushes the first out of buffer
        publisher.publish([stored([9], None, session="t")])
        await wait_for(lambda: sub.stats.last_seq == publisher.seq - 1)
        assert sub.stats.resets == 1 and index.held_tokens("s") is None
    finally:
        await subs.stop()
        publisher.close()


async def test_a_dead_replay_endpoint_forgets_instead_of_hanging() -> None:
    publisher = FakeKvPublisher()
    ctx = zmq.asyncio.Context()
    index = NodeResidency()
    sub = NodeSubscriber(KvEventSource("http://d0", publisher.endpoint, "tcp://127.0.0.1:9"),
                         index)
    try:
        from proxy.live.kv_events import parse_batch, encode_batch  # noqa: I001
        first = parse_batch(0, encode_batch(0.0, [stored([1], None)]))
        await sub.handle(first, ctx)
        later = parse_batch(5, encode_batch(0.0, [stored([2], 1)]))
        await sub.handle(later, ctx)
        assert sub.stats.resets == 1 and sub.stats.last_seq == 5
        assert index.held_tokens("s") is None
    finally:
        ctx.destroy(linger=0)
        publisher.close()


async def test_a_subscriber_joining_late_learns_the_nodes_past_from_its_replay(
        publisher: FakeKvPublisher) -> None:
    # The node served a session before the proxy started: a plain SUB never sees those
    # batches; `joining` (what policy live uses) replays them before its first live batch.
    publisher.publish([stored([1, 2], None)], drop=True)
    publisher.publish([stored([3], 2)], drop=True)
    index = NodeResidency()
    source = KvEventSource("http://d0", publisher.endpoint, publisher.replay_endpoint)
    sub = NodeSubscriber.joining(source, index)
    subs = KvEventSubscribers([sub])
    subs.start()
    try:
        await connected(publisher, sub)
        await wait_for(lambda: sub.stats.last_seq == publisher.seq - 1)
        assert index.is_resident(1) and index.is_resident(3)
        assert sub.stats.gaps == 0 and sub.stats.resets == 0 and sub.stats.replayed >= 2
        if not publisher.positional:
            assert index.held_tokens("s") == 48
    finally:
        await subs.stop()


async def test_a_late_subscriber_without_replay_starts_from_what_it_hears() -> None:
    publisher = FakeKvPublisher()
    try:
        publisher.publish([stored([1, 2], None)], drop=True)
        sub = NodeSubscriber.joining(KvEventSource("http://d0", publisher.endpoint),
                                     NodeResidency())
        assert sub.stats.last_seq is None  # no replay socket: nothing to ask, no gap either
    finally:
        publisher.close()


async def test_a_node_that_restarts_numbers_from_zero_and_holds_nothing(
        publisher: FakeKvPublisher) -> None:
    index = NodeResidency()
    sub = NodeSubscriber.joining(KvEventSource("http://d0", publisher.endpoint,
                                               publisher.replay_endpoint), index)
    subs = KvEventSubscribers([sub])
    subs.start()
    try:
        await connected(publisher, sub)
        publisher.publish([stored([1, 2], None)])
        await wait_for(lambda: sub.stats.last_seq == publisher.seq - 1)
        if not publisher.positional:
            assert index.held_tokens("s") == 32
        publisher.seq, publisher.buffer = 0, []  # the node restarted: a new sequence, no cache
        publisher.publish([stored([7], None, session="t")])
        await wait_for(lambda: sub.stats.restarts == 1 and sub.stats.last_seq == 0)
        assert index.is_resident(7)
        if not publisher.positional:
            assert index.held_tokens("s") == 0  # known to be gone, not unknown
            assert index.held_tokens("t") == 16
    finally:
        await subs.stop()

"""Issue #45, failures 5-8: KV events bounded in bytes and plausibility - 1 MB hashes and
session ids, claimed capacities of 10^12 blocks, a forged far-future batch, a replay socket
answering stale batches forever."""

from __future__ import annotations

import asyncio
import time

import msgpack
import pytest
import zmq
import zmq.asyncio

from proxy.live.kv_events import (
    MAX_HASH_BYTES,
    BlockStored,
    EventBatch,
    KvEventError,
    encode_batch,
    encode_seq,
    parse_batch,
)
from proxy.live.kv_subscriber import MAX_SEQ_JUMP, KvEventSource, NodeSubscriber
from proxy.live.residency import MAX_CLAIMED_KV_BLOCKS, NodeResidency, Rejection, Residency


def stored(hashes: list[int], parent: int | None, session: str = "s") -> BlockStored:
    return BlockStored(tuple(hashes), parent, 16 * len(hashes), 16, session)


def raw_event(**fields: object) -> bytes:
    event = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
             "token_ids": [0] * 16, "block_size": 16, **fields}
    return msgpack.packb([time.time(), [event]], use_bin_type=True)


@pytest.mark.parametrize("fields", [
    {"block_hashes": [b"h" * (1024 * 1024)]},
    {"block_hashes": [b"h" * (MAX_HASH_BYTES + 1)]},
    {"parent_block_hash": b"p" * (1024 * 1024)},
    {"session_id": "s" * (1024 * 1024)},
    {"block_hashes": [True]},
])
def test_oversized_hashes_and_session_ids_are_malformed(fields: dict[str, object]) -> None:
    with pytest.raises(KvEventError):
        parse_batch(0, raw_event(**fields))


def test_a_32_byte_digest_and_a_256_char_session_are_fine() -> None:
    batch = parse_batch(0, raw_event(block_hashes=[b"h" * 32], session_id="s" * 256))
    assert isinstance(batch.events[0], BlockStored)


@pytest.mark.parametrize("ts", [float("nan"), float("inf")])
def test_a_non_finite_timestamp_is_malformed(ts: float) -> None:
    with pytest.raises(KvEventError):
        parse_batch(0, msgpack.packb([ts, []]))


def test_a_claimed_capacity_is_clamped_but_the_operators_is_not() -> None:
    residency = Residency()
    residency.node("http://d")
    residency.node_capacity("http://d", 10**12)
    assert residency.nodes["http://d"].capacity == MAX_CLAIMED_KV_BLOCKS
    operator = Residency(10**7)
    operator.node("http://d")
    operator.node_capacity("http://d", 10**12)
    assert operator.nodes["http://d"].capacity == 10**7


async def test_a_forged_far_future_batch_is_dropped_and_honest_batches_still_apply() -> None:
    index = NodeResidency()
    sub = NodeSubscriber(KvEventSource("http://d0", "tcp://127.0.0.1:9"), index)
    ctx = zmq.asyncio.Context()
    try:
        now = time.time()
        await sub.handle(EventBatch(0, now, (stored([1], None),)), ctx)
        week = 7 * 24 * 3600.0
        await sub.handle(EventBatch(2**40, now + week, ()), ctx)  # both implausible
        await sub.handle(EventBatch(1, now + week, ()), ctx)  # stamped a week ahead
        await sub.handle(EventBatch(2 + MAX_SEQ_JUMP, now, ()), ctx)  # numbered far ahead
        assert index.rejected[Rejection.IMPLAUSIBLE] == 3
        assert index.held_tokens("s") == 16  # not wiped
        await sub.handle(EventBatch(1, now + 1, (stored([2], 1),)), ctx)
        await sub.handle(EventBatch(2, now + 2, (stored([3], 2),)), ctx)
        assert index.held_tokens("s") == 48  # the honest batches after it applied
        assert sub.stats.last_seq == 2 and sub.stats.gaps == 0
    finally:
        ctx.term()


async def test_a_forged_first_batch_cannot_shadow_the_stream_for_long() -> None:
    """Without a batch seen yet any number is accepted (the index starts empty), but not a
    time ahead of the clock: an honest batch restarts the sequence once it is later."""
    index = NodeResidency()
    clock = [1000.0]
    sub = NodeSubscriber(KvEventSource("http://d0", "tcp://127.0.0.1:9"), index,
                         max_skew=10.0, wall_clock=lambda: clock[0])
    ctx = zmq.asyncio.Context()
    try:
        await sub.handle(EventBatch(2**40, 1000.0 + 7 * 86400, ()), ctx)
        assert index.rejected[Rejection.IMPLAUSIBLE] == 1 and sub.stats.last_seq is None
        await sub.handle(EventBatch(5, 1001.0, (stored([1], None),)), ctx)
        assert index.held_tokens("s") == 16
    finally:
        ctx.term()


async def test_a_replay_socket_answering_stale_batches_forever_is_given_up() -> None:
    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = asyncio.Event()

    async def stale_forever() -> None:
        identity, _, _ = await router.recv_multipart()
        payload = encode_batch(time.time(), [])
        while not stop.is_set():
            await router.send_multipart([identity, b"", b"t", encode_seq(0), payload])
            await asyncio.sleep(0)

    server = asyncio.create_task(stale_forever())
    index = NodeResidency()
    sub = NodeSubscriber(KvEventSource("http://d0", "tcp://127.0.0.1:9",
                                       f"tcp://127.0.0.1:{port}"), index)
    try:
        now = time.time()
        await sub.handle(EventBatch(0, now, (stored([1], None),)), ctx)
        started = time.perf_counter()
        await sub.handle(EventBatch(5, now + 1, (stored([9], None, "t"),)), ctx)
        assert time.perf_counter() - started < 2.0  # gave up after what was missed + slack
        assert sub.stats.resets == 1 and sub.stats.last_seq == 5
        assert index.held_tokens("t") == 16
    finally:
        stop.set()
        await server
        router.close()
        ctx.term()

"""The KV event publisher's dropped batches: counted when a subscriber has no room, exported
on the node's /metrics, and a full subscriber does not starve the others (real ZMQ on
loopback, a real node app over HTTP)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from profiler.emulate.app import create_node_app
from profiler.emulate.kv_publisher import KvEventPublisher
from profiler.emulate.presets import resolve
from profiler.emulate.serve import node_specs
from profiler.emulate.service import NodeService
from profiler.emulate.tokenizer import Vocabulary
from proxy.live.kv_events import BlockRemoved, parse_seq
from proxy.serving.server import running
from proxy.shared.vocabulary import Role

MODEL = "llama-3.1-8b"
DROPPED = "ppd:emulator_kv_events_dropped_total"
WAIT_S = 30.0
# A batch of ~45 KB: a subscriber that does not read is soon full (its queue of 10 batches,
# the kernel's send buffer of at most 4 MB, its receive buffer set to 64 KB).
BIG = [BlockRemoved(tuple(range(2**40, 2**40 + 5000)))]
AFTER = 20  # batches published after the first drop


def node(vocab: Vocabulary, publisher: KvEventPublisher | None) -> NodeService:
    preset = resolve("linear", MODEL, max_model_len=4096)
    spec = node_specs(preset, MODEL, [(Role.DECODE, 0)])[0]
    engine = preset.make_engine(Role.DECODE, kv_events=publisher is not None)
    return NodeService(spec, engine, vocab, None, publisher)


@pytest.fixture
async def served(vocab: Vocabulary) -> AsyncIterator[tuple[str, KvEventPublisher]]:
    # Ten batches queued per subscriber (1,000 on a node): one that does not read is soon
    # full. (With one, a subscriber that reads can look full too: libzmq learns what it read
    # a little later.)
    publisher = KvEventPublisher("127.0.0.1", 0, None, send_hwm=10)
    async with running(create_node_app(node(vocab, publisher))) as server:
        yield server.url, publisher


def subscriber(ctx: zmq.asyncio.Context, endpoint: str) -> zmq.asyncio.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.RCVBUF, 65536)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


async def dropped_on_metrics(url: str) -> float | None:
    async with httpx.AsyncClient(timeout=30) as client:
        text = (await client.get(f"{url}/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == DROPPED:
                return sample.value
    return None


async def test_a_full_subscriber_makes_the_publisher_drop_and_metrics_count_it(
        served: tuple[str, KvEventPublisher]) -> None:
    url, publisher = served
    assert publisher.endpoint is not None
    assert await dropped_on_metrics(url) == 0
    ctx = zmq.asyncio.Context()
    stuck = subscriber(ctx, publisher.endpoint)  # never reads
    reader = subscriber(ctx, publisher.endpoint)
    received: list[int] = []

    async def receive() -> None:
        frames = await asyncio.wait_for(reader.recv_multipart(), WAIT_S)
        received.append(parse_seq(frames[1]))

    try:
        deadline = time.monotonic() + WAIT_S
        while not received:  # the reader has subscribed (the stuck one connected before it)
            assert time.monotonic() < deadline, "no batch reached the reading subscriber"
            publisher.publish([BlockRemoved((1,))])
            if await reader.poll(50):
                await receive()
        first = publisher.seq
        # Lock-step, so that the reader never is the full one: a batch, then the reader has
        # it. The stuck subscriber fills up and the publisher drops what it cannot take.
        while publisher.dropped == 0 or publisher.seq < first + AFTER:
            assert time.monotonic() < deadline, "the publisher never dropped a batch"
            publisher.publish(BIG)
            await receive()
        # Every batch reached the reader: a send refused because one subscriber is full is
        # sent again to those with room.
        assert received[-(publisher.seq - first):] == list(range(first, publisher.seq))
        assert publisher.dropped > 0
        assert await dropped_on_metrics(url) == publisher.dropped
    finally:
        reader.close(linger=0)
        stuck.close(linger=0)
        ctx.term()


async def test_a_node_that_publishes_no_events_exports_no_dropped_count(
        vocab: Vocabulary) -> None:
    async with running(create_node_app(node(vocab, None))) as server:
        assert await dropped_on_metrics(server.url) is None

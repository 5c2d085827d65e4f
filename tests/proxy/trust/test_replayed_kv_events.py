"""Issue #45's failures 5-8 (KV-event residency) replayed against a served `ppd proxy --policy
live`, each under the bar of tests/proxy/trust/served.py (/health within 1 s, RSS within +200
MB, the steady client served 200), with a forged publisher on D's KV-event socket:

5. events with 1 MB block hashes or 1 MB session ids (+435 MB once, the gauge saying 0.1 MB);
6. a node whose /metrics claims 10^12 KV blocks (believed, so nothing bounded its index);
7. one batch numbered 2^40 and stamped a week ahead (it wiped the index, then every honest
   batch was dropped as a duplicate, uncounted, for good) - rejected and counted, and the
   honest batches after it applied (the issue's done-when);
8. a replay socket answering stale batches forever (the subscriber stalled).

An event gets no answer, so "the request in question" is read on /stats: the rejection
counted by reason, and the index within its bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import zmq

from proxy.live.kv_events import encode_seq
from proxy.live.residency import DEFAULT_KV_BLOCKS, MAX_CLAIMED_KV_BLOCKS
from tests.fakes.fake_kv_publisher import TOPIC, FakeKvPublisher
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.trust.served import MIB, ServedProxy, served_proxy, watching

COSTS = {"base_ms": 5.0, "per_prefill_token_ms": 0.05, "per_decode_seq_ms": 0.02,
         "source": "round numbers for the test"}
WEEK_S = 7 * 24 * 3600.0


def event(**fields: Any) -> dict[str, Any]:
    """One BlockStored event as vLLM packs it (a map), fields overridden."""
    return {"type": "BlockStored", "block_hashes": [b"h" * 32], "parent_block_hash": None,
            "token_ids": [0] * 16, "block_size": 16, **fields}


def send_raw(publisher: FakeKvPublisher, events: list[dict[str, Any]], seq: int | None = None,
             ts: float | None = None) -> int:
    """Publish one batch packed by hand (the fake's encoder would refuse what is forged)."""
    if seq is None:
        seq, publisher.seq = publisher.seq, publisher.seq + 1
    payload = msgpack.packb([time.time() if ts is None else ts, events], use_bin_type=True)
    publisher.pub.send_multipart([TOPIC, encode_seq(seq), payload])
    return seq


async def kv_stats(proxy: ServedProxy, node: str) -> dict[str, Any]:
    stats = await asyncio.to_thread(httpx.get, proxy.url + "/stats", timeout=10)
    return dict(stats.json()["kv_events"][node])


@contextlib.asynccontextmanager
async def live_proxy(tmp_path: Path, publisher: FakeKvPublisher, *extra: str,
                     d: FakeVLLM | None = None) -> AsyncIterator[tuple[ServedProxy, str]]:
    """`ppd proxy --policy live` over a fake P and D, D's events coming from publisher; yields
    once the subscriber has received a batch (a SUB misses what precedes its connection)."""
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(COSTS))
    endpoints = ",".join(e for e in (publisher.endpoint, publisher.replay_endpoint) if e)
    async with contextlib.AsyncExitStack() as stack:
        p = await stack.enter_async_context(FakeVLLM("p"))
        d = d or await stack.enter_async_context(FakeVLLM("d"))
        proxy = await stack.enter_async_context(served_proxy(
            ["--prefill", p.url, "--decode", d.url, "--policy", "live", "--live-costs",
             str(costs), "--kv-events", f"{d.url}={endpoints}", *extra]))
        for _ in range(300):
            send_raw(publisher, [event(block_hashes=[b"probe"])])
            if (await kv_stats(proxy, d.url))["batches"]:
                break
            await asyncio.sleep(0.05)
        yield proxy, d.url


async def settled(proxy: ServedProxy, node: str, publisher: FakeKvPublisher) -> dict[str, Any]:
    """/stats once the subscriber has handled everything sent so far (a last honest batch)."""
    last = send_raw(publisher, [event(block_hashes=[b"last"])])
    for _ in range(400):
        stats = await kv_stats(proxy, node)
        if stats["last_seq"] == last:
            return stats
        await asyncio.sleep(0.05)
    raise AssertionError(f"batch {last} never handled: {stats}")


@contextlib.contextmanager
def publishing(**options: bool) -> Iterator[FakeKvPublisher]:
    publisher = FakeKvPublisher(**options)
    try:
        yield publisher
    finally:
        publisher.close()


async def test_05_1_mb_block_hashes_and_session_ids(tmp_path: Path) -> None:
    forged = [event(block_hashes=[b"h" * MIB]), event(parent_block_hash=b"p" * MIB),
              event(block_hashes=[b"s" * 32], session_id="s" * MIB)]
    with publishing() as publisher:
        async with live_proxy(tmp_path, publisher) as (proxy, d), watching(proxy):
            for i in range(150):  # 150 MB in all
                await asyncio.to_thread(send_raw, publisher, [forged[i % 3]])
            stats = await settled(proxy, d, publisher)
    assert stats["rejected"].get("malformed", 0) >= 100, stats  # a few may drop (PUB's HWM)
    assert stats["memory_bytes"] < MIB and stats["blocks_resident"] <= 2, stats


async def test_06_a_node_claiming_10_to_the_12_kv_blocks(tmp_path: Path) -> None:
    async with FakeVLLM("d") as d:
        d.metrics_text = ('vllm:cache_config_info{block_size="16",num_gpu_blocks='
                          '"1000000000000"} 1.0\nvllm:num_requests_running 0\n')
        with publishing() as publisher:
            async with live_proxy(tmp_path, publisher, "--metrics-interval", "0.2",
                                  d=d) as (proxy, node), watching(proxy):
                for _ in range(100):  # until a scrape has read the claim
                    if (await kv_stats(proxy, node))["capacity_blocks"] != DEFAULT_KV_BLOCKS:
                        break
                    await asyncio.sleep(0.1)
                # 50,000 blocks in 50 batches: held, all within the clamped capacity.
                for i in range(50):
                    batch = [event(block_hashes=[(i * 1000 + j).to_bytes(32, "big")])
                             for j in range(1000)]
                    await asyncio.to_thread(send_raw, publisher, batch)
                stats = await settled(proxy, node, publisher)
    assert stats["capacity_blocks"] == MAX_CLAIMED_KV_BLOCKS, stats
    assert stats["blocks_resident"] <= MAX_CLAIMED_KV_BLOCKS


async def test_07_a_forged_batch_2_to_the_40_a_week_ahead(tmp_path: Path) -> None:
    with publishing() as publisher:
        async with live_proxy(tmp_path, publisher) as (proxy, d), watching(proxy):
            honest = [event(block_hashes=[bytes([i]) * 32], session_id="victim")
                      for i in range(1, 4)]
            send_raw(publisher, [honest[0]])
            before = await settled(proxy, d, publisher)
            send_raw(publisher, [event(block_hashes=[b"f" * 32])], seq=2**40,
                     ts=time.time() + WEEK_S)
            for later in honest[1:]:  # honest batches after it, numbered on from the last
                send_raw(publisher, [later])
            after = await settled(proxy, d, publisher)
    assert after["rejected"] == {"implausible": 1}, after
    assert after["forgotten"] == before["forgotten"]  # the index was not wiped
    assert after["batches"] >= before["batches"] + 3  # both honest ones and the last applied
    assert after["blocks_resident"] >= before["blocks_resident"] + 2


async def test_08_a_replay_socket_answering_stale_batches_forever(tmp_path: Path) -> None:
    with publishing(replay=True, answer_replay=False) as publisher:
        stop = threading.Event()
        stale = threading.Thread(target=answer_stale_forever, args=(publisher, stop))
        stale.start()
        try:
            async with live_proxy(tmp_path, publisher) as (proxy, d), watching(proxy):
                publisher.seq += 5  # a gap: the subscriber asks the replay socket
                started = time.monotonic()
                stats = await settled(proxy, d, publisher)
                took = time.monotonic() - started
        finally:
            stop.set()
            stale.join(5)
    assert took < 10.0 and stats["gaps"] >= 1, stats
    assert stats["gaps_replayed"] == 0  # given up, not filled by stale batches


def answer_stale_forever(publisher: FakeKvPublisher, stop: threading.Event) -> None:
    """The replay socket answering every request with batch 0, again and again."""
    payload = msgpack.packb([time.time(), []], use_bin_type=True)
    router = publisher.router
    while not stop.is_set():
        if not router.poll(50):
            continue
        identity, _, _ = router.recv_multipart()
        while not stop.is_set() and not router.poll(1):  # until the next request
            for _ in range(100):
                with contextlib.suppress(zmq.Again):
                    router.send_multipart([identity, b"", TOPIC, encode_seq(0), payload],
                                          flags=zmq.NOBLOCK)

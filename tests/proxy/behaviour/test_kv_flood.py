"""A forged KV-event publisher against a real proxy under policy live (issue "Trust, third pass").

A publisher bound where a node's events are expected sends a self-parent block, a two-block
parent cycle, a 20,000-block chain and 100,000 random blocks (the benchmark,
benchmarks/kv_events.py, sends 1M and measures loop block and RSS; here the point is the
proxy's behaviour while it lasts): /stats answers within 1 s throughout, chat answers 200,
the cycles are counted on /metrics, and the node's residency index stays within its
capacity. Fakes only, loopback only; ~20-60 s on a loaded machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import httpx

from proxy import ProxyConfig, create_app
from proxy.config.cluster_file import NodeSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.kv_events import BlockStored
from proxy.live.kv_subscriber import KvEventSource
from proxy.serving.server import running
from proxy.shared.vocabulary import Role
from tests.fakes.fake_kv_publisher import FakeKvPublisher
from tests.fakes.fake_vllm import FakeVLLM

COSTS = {"base_ms": 5.0, "per_prefill_token_ms": 0.05, "per_decode_seq_ms": 0.02,
         "source": "round numbers for the test"}
CAPACITY = 50_000  # --kv-blocks: the random flood is twice this


def _stored(blocks: list[object], parent: object, session: str | None) -> BlockStored:
    return BlockStored(tuple(blocks), parent, 16 * len(blocks), 16, session)  # type: ignore[arg-type]


def _floods() -> list[tuple[str, list[list[BlockStored]]]]:
    chain = [[_stored([0], None, "chain")]]
    chain += [[_stored([i], i - 1, "chain")] for i in range(1, 20_000)]
    return [
        ("self-parent", [[_stored([b"s" * 32], b"s" * 32, "victim")]]),
        ("2-block cycle", [[_stored([b"a" * 32], b"b" * 32, None)],
                           [_stored([b"b" * 32], b"a" * 32, None)],
                           [_stored([b"c" * 32], b"a" * 32, "victim")]]),
        ("20k chain", chain),
        ("100k random", [[_stored([os.urandom(32)], None, None) for _ in range(1_000)]
                         for _ in range(100)]),
    ]


async def test_a_forged_publisher_neither_stalls_nor_swells_the_proxy(tmp_path: Path) -> None:
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(COSTS))
    publisher = FakeKvPublisher()
    floods = _floods()  # built before the proxy runs: building them is not the proxy's time
    try:
        async with FakeVLLM("p") as p, FakeVLLM("d") as d:
            config = ProxyConfig(
                nodes=(NodeSpec(p.url, Role.PREFILL), NodeSpec(d.url, Role.DECODE)),
                policy=PolicyConfig(kind=Policy.LIVE, live_costs=costs), port=0,
                kv_blocks=CAPACITY, kv_events=(KvEventSource(d.url, publisher.endpoint),))
            app = create_app(config)
            subscriber = app.extensions["ppd"].live.subscribers.subscribers[0]
            async with running(app) as server, httpx.AsyncClient(
                    base_url=server.url, timeout=30) as client:
                while subscriber.stats.batches == 0:  # PUB drops what precedes the SUB
                    publisher.publish([_stored([b"probe"], None, None)])
                    await asyncio.sleep(0.02)
                slowest = 0.0
                for name, batches in floods:
                    sent = asyncio.create_task(asyncio.to_thread(
                        lambda batches=batches: [publisher.publish(b) for b in batches]))
                    while not sent.done():
                        started = time.monotonic()
                        stats = await client.get("/stats")
                        slowest = max(slowest, time.monotonic() - started)
                        assert stats.status_code == 200
                        chat = await client.post("/v1/chat/completions", json={
                            "model": "fake-model", "max_tokens": 4,
                            "messages": [{"role": "user", "content": f"during {name}"}]})
                        assert chat.status_code == 200, name
                        await asyncio.sleep(0.05)
                    await sent
                    assert slowest < 1.0, f"/stats took {slowest:.2f} s during {name}"
                    assert subscriber.index.num_blocks <= CAPACITY
                # Everything sent has been handled once a last batch comes through.
                last = publisher.publish([_stored([b"last"], None, None)])
                for _ in range(3000):
                    if subscriber.stats.last_seq == last:
                        break
                    await asyncio.sleep(0.02)
                assert subscriber.stats.last_seq == last
                assert subscriber.index.num_blocks <= CAPACITY
                assert subscriber.index.memory_bytes() < 200 * 2**20
                exposition = (await client.get("/metrics")).text
                stats = (await client.get("/stats")).json()
    finally:
        publisher.close()
    health = stats["kv_events"][d.url]
    assert health["rejected"]["cycle"] == 2
    assert f'ppd_kv_events_rejected_total{{node="{d.url}",reason="cycle"}} 2.0' in exposition
    assert health["capacity_blocks"] == CAPACITY and health["blocks_resident"] <= CAPACITY

"""Issue #45's done-when, replayed against a served proxy: while the hostile input arrives
the proxy answers /health within 1 s, its RSS stays within 200 MB of where it started, the
request in question gets a 4xx or 502 naming the limit, and another client gets a 200.

(The proxy and its fake nodes share this process: the RSS measured is theirs together, so
the fakes here stream what they send instead of holding it.)"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import msgpack
import orjson
import zmq
import zmq.asyncio

from proxy.shared.limits import MIB
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import ProxyUnderTest, chat_body, config_for, serve_proxy

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


@dataclass
class Watch:
    """/health latency and RSS growth, sampled while the hostile input arrives."""

    start_rss: int
    worst_health_s: float = 0.0
    peak_rss: int = 0

    @property
    def grew_mb(self) -> float:
        return (self.peak_rss - self.start_rss) / MIB


@contextlib.asynccontextmanager
async def watching(proxy: ProxyUnderTest) -> AsyncIterator[Watch]:
    watch = Watch(rss())
    stop = asyncio.Event()

    async def sample() -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            started = loop.time()
            response = await proxy.client.get("/health", timeout=5.0)
            assert response.status_code in (200, 503)
            watch.worst_health_s = max(watch.worst_health_s, loop.time() - started)
            watch.peak_rss = max(watch.peak_rss, rss())
            await asyncio.sleep(0.05)

    task = asyncio.create_task(sample())
    try:
        yield watch
    finally:
        stop.set()
        await task
    watch.peak_rss = max(watch.peak_rss, rss())
    print(f"replay: worst /health {watch.worst_health_s:.3f} s, RSS +{watch.grew_mb:.0f} MB")
    assert watch.worst_health_s < 1.0, watch
    assert watch.grew_mb < 200, watch


async def test_25_mb_heartbeats_with_a_wrong_token(cluster: dict[str, FakeVLLM]) -> None:
    config = replace(config_for(cluster), discovery="tcp://127.0.0.1:0", discovery_token="t")
    # Packed before the watch: packing 25 MB here would block this (shared) event loop.
    beat = msgpack.packb({"type": "decode", "url": "http://x:1", "token": "wrong",
                          "pad": "x" * 25 * MIB})
    async with serve_proxy(config) as proxy, watching(proxy):
        assert proxy.state.discovery is not None and proxy.state.discovery.bound_address
        ctx = zmq.asyncio.Context()
        try:
            for _ in range(3):
                dealer = ctx.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.connect(proxy.state.discovery.bound_address)
                await dealer.send(beat, copy=False)
                await asyncio.sleep(0.3)
                dealer.close()
        finally:
            ctx.term()
        served = await proxy.client.post("/v1/chat/completions", json=chat_body("hi"))
        assert served.status_code == 200
        assert proxy.state.pool.get("http://x:1") is None


async def test_950k_messages(cluster: dict[str, FakeVLLM]) -> None:
    config = replace(config_for(cluster), max_body_bytes=32 * MIB)
    body = orjson.dumps({"messages": [{"role": "user", "content": ""}] * 950_000})
    async with serve_proxy(config) as proxy, watching(proxy):
        refused, served = await asyncio.gather(
            proxy.client.post("/v1/chat/completions", content=body,
                              headers={"content-type": "application/json"}),
            proxy.client.post("/v1/chat/completions", json=chat_body("hi")))
    assert refused.status_code == 400 and "--max-messages" in refused.text
    assert served.status_code == 200


@contextlib.asynccontextmanager
async def huge_answer_node(total: int) -> AsyncIterator[str]:
    """A node whose whole answer is `total` bytes of one JSON string, sent as it is made."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            await reader.readexactly(length)
            if b"/health" in head.split(b"\r\n")[0]:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n" % total)
            piece = b"x" * MIB
            for _ in range(total // MIB):
                writer.write(piece)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def test_a_200_mb_answer(cluster: dict[str, FakeVLLM]) -> None:
    async with huge_answer_node(200 * MIB) as url:
        big = FakeVLLM("d9")
        big.url = url
        nodes = {"p1": cluster["p1"], "d9": big}
        async with serve_proxy(config_for(nodes)) as proxy, watching(proxy):
            refused = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
        assert refused.status_code == 502 and "--max-answer-bytes" in refused.text
    async with serve_proxy(config_for(cluster)) as proxy:
        served = await proxy.client.post("/v1/chat/completions", json=chat_body("hi"))
    assert served.status_code == 200

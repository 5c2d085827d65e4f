"""Issue #45's failures 1-4 replayed against a served `ppd proxy` (tests/proxy/trust/served.py
holds the bar: /health within 1 s, RSS within +200 MB, the steady client served 200):

1. three 25 MB heartbeats with a wrong token on the discovery socket (and 2,000 of 60 KB
   with a wrong token frame: compared, never unpacked);
2. 2,000 registrations under --discovery-insecure;
3. a 9.6 MB body of 600k tiny messages with a real Redis as the session store;
4. the same shape without Redis: 950k messages, 15 MB.

A heartbeat gets no answer, so for 1 and 2 "the request in question" is the forged node:
it never appears in the pool (/health lists it), and the pool stays under its cap.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import msgpack
import orjson
import zmq

from tests.fakes.fake_vllm import FakeVLLM
from tests.fakes.redis_server import RedisServer, free_port
from tests.proxy.trust.served import MIB, ServedProxy, served_proxy, watching


def send_beats(address: str, beats: list[list[bytes]], pause_s: float = 0.0) -> None:
    """Each heartbeat (its frames) from a DEALER of its own, like that many nodes (run in a
    thread)."""
    context = zmq.Context()
    try:
        for beat in beats:
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 2000)
            dealer.connect(address)
            dealer.send_multipart(beat, copy=False)
            dealer.close()
            time.sleep(pause_s)
    finally:
        context.term()  # waits (LINGER) until every beat left


def flood(address: str, frames: list[bytes], count: int) -> None:
    """The same heartbeat count times from one DEALER (run in a thread)."""
    context = zmq.Context()
    try:
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 5000)
        dealer.connect(address)
        for _ in range(count):
            dealer.send_multipart(frames, copy=False)
        dealer.close()
    finally:
        context.term()


def nodes_in_pool(proxy: ServedProxy) -> list[str]:
    return [node["url"] for node in httpx.get(proxy.url + "/health").json()["nodes"]]


def p_and_d(p: FakeVLLM, d: FakeVLLM) -> list[str]:
    return ["--prefill", p.url, "--decode", d.url]


async def test_01_three_25_mb_heartbeats_with_a_wrong_token() -> None:
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    # Built before the watch: packing 25 MB holds this process's GIL (the prober's too).
    beat = msgpack.packb({"type": "decode", "url": "http://forged:1", "token": "wrong",
                          "pad": "x" * 25 * MIB})
    # And 2,000 under the size limit with a wrong token frame: compared, never unpacked.
    small = [b"wrong", msgpack.packb({"type": "decode", "url": "http://forged:2",
                                      "pad": "x" * 60_000})]
    async with FakeVLLM("p") as p, FakeVLLM("d") as d, served_proxy(
            [*p_and_d(p, d), "--discovery", address, "--discovery-token", "s3cret"]) as proxy:
        async with watching(proxy):
            await asyncio.to_thread(send_beats, address, [[beat]] * 3, 0.3)
            await asyncio.to_thread(flood, address, small, 2000)
            await asyncio.sleep(0.5)
        pool = nodes_in_pool(proxy)
    assert "http://forged:1" not in pool and "http://forged:2" not in pool


async def test_02_two_thousand_insecure_registrations() -> None:
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    beats = [[msgpack.packb({"type": "decode", "url": f"http://n{i}:1"})] for i in range(2000)]
    async with FakeVLLM("p") as p, FakeVLLM("d") as d, served_proxy(
            [*p_and_d(p, d), "--discovery", address, "--discovery-insecure"]) as proxy:
        async with watching(proxy):
            await asyncio.to_thread(send_beats, address, beats)
            await asyncio.sleep(0.5)
            started = time.monotonic()
            stats = await asyncio.to_thread(httpx.get, proxy.url + "/stats", timeout=10)
            stats_s = time.monotonic() - started
        registered = [url for url in nodes_in_pool(proxy) if url.startswith("http://n")]
    assert stats.status_code == 200 and stats_s < 1.0  # 2,000 nodes once made it 3 s
    # A burst of 4 s of --discovery-registrations-per-s (20), plus what refilled meanwhile.
    assert 0 < len(registered) < 400, len(registered)


def tiny_messages(count: int, message: dict[str, str] | None = None) -> bytes:
    return orjson.dumps({"model": "fake-model", "max_tokens": 4,
                         "messages": [message or {"role": "user", "content": ""}] * count})


async def refused_body(proxy: ServedProxy, body: bytes) -> httpx.Response:
    """POST a prepared body from a thread: its event loop is not the one serving the fakes."""
    def post() -> httpx.Response:
        return httpx.post(proxy.url + "/v1/chat/completions", content=body, timeout=60,
                          headers={"content-type": "application/json"})
    return await asyncio.to_thread(post)


async def test_03_600k_messages_with_a_shared_redis(tmp_path: Path) -> None:
    body = tiny_messages(600_000, {"role": "user"})  # 16 bytes each, as in the issue
    assert 9 * MIB < len(body) < 16 * MIB  # under --max-body-bytes' default: the count bites
    with RedisServer(tmp_path) as redis:
        async with FakeVLLM("p") as p, FakeVLLM("d") as d, served_proxy(
                [*p_and_d(p, d), "--session-store", redis.url]) as proxy, watching(proxy):
            refused = await refused_body(proxy, body)
    assert refused.status_code == 400 and "--max-messages" in refused.text
    assert all(len(r.body["messages"]) < 10 for r in p.completions + d.completions)


async def test_04_950k_messages_without_redis() -> None:
    body = tiny_messages(950_000)
    async with FakeVLLM("p") as p, FakeVLLM("d") as d, served_proxy(
            [*p_and_d(p, d), "--max-body-bytes", str(32 * MIB)]) as proxy, watching(proxy):
        refused = await refused_body(proxy, body)
    assert refused.status_code == 400 and "--max-messages" in refused.text
    assert all(len(r.body["messages"]) < 10 for r in p.completions + d.completions)

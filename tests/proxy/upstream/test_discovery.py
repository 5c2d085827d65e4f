"""Discovery: heartbeats over a real ZMQ socket add nodes; silence removes them."""

from __future__ import annotations

import asyncio
import threading

import msgpack
import pytest
import zmq
import zmq.asyncio

from proxy.config.settings import ProxyConfig
from proxy.shared.vocabulary import Role
from proxy.upstream.backends import BackendPool, Source
from proxy.upstream.discovery import (
    Discovery,
    HeartbeatError,
    heartbeat,
    parse_heartbeat,
    send_heartbeats,
)
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import FakeClock, chat_body, serve_proxy


def test_parse_both_formats() -> None:
    legacy = parse_heartbeat(msgpack.packb({"type": "P", "http_address": "10.0.0.1:8100",
                                            "zmq_address": "10.0.0.1:21001"}))
    assert (legacy.url, legacy.role, legacy.zmq_address) == (
        "http://10.0.0.1:8100", Role.PREFILL, "10.0.0.1:21001")
    rich = parse_heartbeat(msgpack.packb({"type": "replica", "url": "http://r:1",
                                          "models": ["m"]}))
    assert (rich.url, rich.role, rich.models) == ("http://r:1", Role.REPLICA, ("m",))


@pytest.mark.parametrize("payload", [b"\xc1garbage", msgpack.packb([1, 2]),
                                     msgpack.packb({"type": "X", "url": "http://a"}),
                                     msgpack.packb({"type": "D"}),
                                     msgpack.packb({"type": "decode", "url": "ftp://a"})])
def test_bad_heartbeats_are_rejected(payload: bytes) -> None:
    with pytest.raises(HeartbeatError):
        parse_heartbeat(payload)


async def test_legacy_dealer_registers_and_timeout_removes() -> None:
    clock = FakeClock()
    pool = BackendPool()
    discovery = Discovery(pool, "tcp://127.0.0.1:0", heartbeat_timeout=9.0, clock=clock,
                          insecure=True)
    address = discovery.bind()
    task = asyncio.create_task(discovery.run())
    context = zmq.asyncio.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(address)
        await dealer.send(msgpack.packb({"type": "D", "http_address": "127.0.0.1:8200",
                                         "zmq_address": "127.0.0.1:22001"}))
        for _ in range(200):
            if pool.get("http://127.0.0.1:8200"):
                break
            await asyncio.sleep(0.01)
        node = pool.get("http://127.0.0.1:8200")
        assert node is not None and node.role is Role.DECODE
        assert node.source is Source.DISCOVERED and node.zmq_address == "127.0.0.1:22001"
        clock.now = 10.0  # heartbeats stopped 10 s ago
        for _ in range(200):
            if pool.get("http://127.0.0.1:8200") is None:
                break
            await asyncio.sleep(0.01)
        assert pool.get("http://127.0.0.1:8200") is None
    finally:
        dealer.close()
        context.term()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_static_nodes_never_expire() -> None:
    clock = FakeClock()
    pool = BackendPool()
    pool.add("http://static:1", Role.DECODE)
    discovery = Discovery(pool, "tcp://127.0.0.1:0", heartbeat_timeout=1.0, clock=clock,
                          insecure=True)
    discovery.handle(msgpack.packb({"type": "prefill", "url": "http://p:1"}))
    clock.now = 100.0
    assert discovery.expire() == ["http://p:1"]
    assert pool.get("http://static:1") is not None


async def test_proxy_serves_nodes_registered_by_ppd_register() -> None:
    async with FakeVLLM("p1") as p1, FakeVLLM("d1") as d1:
        config = ProxyConfig(discovery="tcp://127.0.0.1:0", port=0, health_interval=60,
                             discovery_insecure=True)
        async with serve_proxy(config) as proxy:
            assert (await proxy.client.get("/health")).status_code == 503
            assert proxy.state.discovery is not None
            address = proxy.state.discovery.bound_address
            assert address is not None
            stop = threading.Event()
            senders = [asyncio.to_thread(send_heartbeats, address, heartbeat(role, url, []),
                                         0.05, 0, stop)
                       for role, url in ((Role.PREFILL, p1.url), (Role.DECODE, d1.url))]
            sending = asyncio.gather(*senders)
            try:
                for _ in range(200):
                    if (await proxy.client.get("/health")).status_code == 200:
                        break
                    await asyncio.sleep(0.02)
                response = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
            finally:
                stop.set()
                await sending
    assert response.status_code == 200
    assert response.headers["x-ppd-prefill"] == p1.url
    assert response.headers["x-ppd-decode"] == d1.url


def test_legacy_heartbeat_map() -> None:
    assert heartbeat(Role.PREFILL, "http://10.0.0.1:8100", [], legacy=True,
                     zmq_address="10.0.0.1:21001") == {
        "type": "P", "http_address": "10.0.0.1:8100", "zmq_address": "10.0.0.1:21001"}
    with pytest.raises(ValueError, match="legacy"):
        heartbeat(Role.REPLICA, "http://r:1", [], legacy=True)


async def test_legacy_registered_nodes_get_the_legacy_request_id() -> None:
    async with FakeVLLM("p1") as p1, FakeVLLM("d1") as d1:
        config = ProxyConfig(discovery="tcp://127.0.0.1:0", port=0, health_interval=60,
                             discovery_insecure=True)
        async with serve_proxy(config) as proxy:
            assert proxy.state.discovery is not None
            for kind, node, zmq_port in (("P", p1, 21001), ("D", d1, 22001)):
                proxy.state.discovery.handle(msgpack.packb({
                    "type": kind, "http_address": node.url.removeprefix("http://"),
                    "zmq_address": f"127.0.0.1:{zmq_port}"}))
            response = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
    assert response.status_code == 200
    p_id = p1.completions[0].headers["x-request-id"]
    assert p_id.startswith("___prefill_addr_127.0.0.1:21001___decode_addr_127.0.0.1:22001_")
    assert d1.completions[0].headers["x-request-id"] == p_id


async def test_ppd_register_main_sends_count_heartbeats(
        capsys: pytest.CaptureFixture[str]) -> None:
    from proxy.upstream.register import main as register_main

    pool = BackendPool()
    discovery = Discovery(pool, "tcp://127.0.0.1:0", heartbeat_timeout=60, clock=FakeClock(),
                          insecure=True)
    address = discovery.bind()
    task = asyncio.create_task(discovery.run())
    try:
        code = await asyncio.to_thread(register_main, [
            "--proxy", address, "--role", "decode", "--url", "http://127.0.0.1:8200",
            "--model", "m", "--interval", "0.01", "--count", "2"])
        for _ in range(200):
            if pool.get("http://127.0.0.1:8200"):
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert code == 0 and "sent 2 heartbeat(s)" in capsys.readouterr().out
    node = pool.get("http://127.0.0.1:8200")
    assert node is not None and node.models == ("m",)

"""Issue #45, failures 1 and 2: a heartbeat is bounded in bytes and its token checked before
it is unpacked, and registrations are rate-limited and capped."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import zmq
import zmq.asyncio

from proxy.shared.vocabulary import Role
from proxy.upstream.backends import BackendPool
from proxy.upstream.discovery import MAX_HEARTBEAT_BYTES, Discovery, HeartbeatError, parse_heartbeat
from tests.proxy.helpers import FakeClock

TOKEN = "s3cret"


def beat(url: str, **extra: object) -> bytes:
    return msgpack.packb({"type": "decode", "url": url, **extra})


def test_a_heartbeat_over_the_byte_limit_is_refused_before_unpacking() -> None:
    huge = beat("http://a:1", models=["m" * MAX_HEARTBEAT_BYTES])
    with pytest.raises(HeartbeatError, match="bytes"):
        parse_heartbeat(huge)


@pytest.mark.parametrize("token", [None, b"wrong", b"s3cret" + b"x" * 60_000])
def test_without_the_token_frame_nothing_is_unpacked(token: bytes | None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    unpacked: list[bytes] = []
    monkeypatch.setattr("proxy.upstream.discovery.msgpack.unpackb",
                        lambda payload, **kw: unpacked.append(payload))
    discovery = Discovery(BackendPool(), "tcp://127.0.0.1:0", 10.0, FakeClock(), token=TOKEN)
    discovery.handle(beat("http://a:1", token=TOKEN), token)  # a token in the map is no token
    assert unpacked == [] and discovery.rejected == 1


def test_a_heartbeat_is_one_or_two_frames() -> None:
    pool = BackendPool()
    discovery = Discovery(pool, "tcp://127.0.0.1:0", 10.0, FakeClock(), token=TOKEN)
    discovery.receive([TOKEN.encode(), TOKEN.encode(), beat("http://a:1")])
    discovery.receive([beat("http://a:1")])
    assert discovery.rejected == 2 and pool.nodes() == []
    discovery.receive([TOKEN.encode(), beat("http://a:1")])
    assert pool.get("http://a:1") is not None


@pytest.mark.parametrize("extra", [{"models": ["m"] * 1000}, {"models": ["m" * 10_000]},
                                   {"url": "http://a:1/\r\nX-Evil: 1"},
                                   {"url": "http://a:1/" + "x" * 5000}])
def test_oversized_or_unsafe_heartbeat_fields_are_refused(extra: dict[str, object]) -> None:
    body = {"type": "decode", "url": "http://a:1", **extra}
    with pytest.raises(HeartbeatError):
        parse_heartbeat(msgpack.packb(body))


async def test_the_socket_drops_a_25_mb_heartbeat_and_keeps_serving() -> None:
    pool = BackendPool()
    discovery = Discovery(pool, "tcp://127.0.0.1:0", 10.0, FakeClock(), token=TOKEN)
    address = discovery.bind()
    task = asyncio.create_task(discovery.run())
    context = zmq.asyncio.Context()
    try:
        big = context.socket(zmq.DEALER)
        big.setsockopt(zmq.LINGER, 0)
        big.connect(address)
        await big.send(b"\x00" * (25 * 1024 * 1024))  # ZMQ cuts this peer off unread
        good = context.socket(zmq.DEALER)
        good.setsockopt(zmq.LINGER, 0)
        good.connect(address)
        await good.send_multipart([TOKEN.encode(), beat("http://good:1")])
        for _ in range(300):
            if pool.get("http://good:1"):
                break
            await asyncio.sleep(0.01)
        assert pool.get("http://good:1") is not None
        assert discovery.rejected == 0  # never unpacked
        big.close()
        good.close()
    finally:
        context.term()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_registrations_are_rate_limited_then_refill() -> None:
    clock = FakeClock()
    pool = BackendPool()
    discovery = Discovery(pool, "tcp://127.0.0.1:0", 60.0, clock, insecure=True,
                          registrations_per_s=5.0)
    for i in range(100):
        discovery.handle(beat(f"http://n{i}:1"))
    assert len(pool.nodes()) == 20  # a burst of 4 s worth
    assert discovery.rejected == 80
    discovery.handle(beat("http://n0:1"))  # known nodes are never limited
    assert discovery.rejected == 80
    clock.now += 1.0
    for i in range(100, 110):
        discovery.handle(beat(f"http://n{i}:1"))
    assert len(pool.nodes()) == 25


def test_registrations_are_capped_and_a_static_node_still_counts_as_served() -> None:
    clock = FakeClock()
    pool = BackendPool()
    pool.add("http://static:1", Role.PREFILL)
    discovery = Discovery(pool, "tcp://127.0.0.1:0", 60.0, clock, insecure=True, max_nodes=3,
                          registrations_per_s=1000.0)
    for i in range(2000):
        discovery.handle(beat(f"http://n{i}:1"))
    assert len(pool.nodes(Role.DECODE)) == 3
    assert discovery.rejected == 1997
    clock.now = 61.0
    discovery.expire()  # silent ones leave, and make room
    discovery.handle(beat("http://late:1"))
    assert pool.get("http://late:1") is not None

"""The readback book in a real redis-server: two stores stand for two workers (or replicas),
and two Routers over one mock cluster show a readback recorded by one taken by the other."""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from proxy.config.cluster_file import NodeSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.config.settings import ProxyConfig
from proxy.live.load_meter import RateMeter
from proxy.observability.metrics import ProxyMetrics
from proxy.policies.routing import RoutingPolicy
from proxy.readback.protocol import MIN_READBACK_TOKENS, HeldKV
from proxy.routing.router import Router
from proxy.serving.app import build_state
from proxy.sessions.readbacks import MemoryReadbacks
from proxy.sessions.redis_readbacks import EXPIRED_KEPT_S, RedisReadbacks
from proxy.sessions.redis_store import PREFIX, RedisStore
from proxy.sessions.session import Held, Lookup, Session
from proxy.shared.tokens import token_counter
from proxy.shared.vocabulary import Reason, Role, RouteKind
from proxy.upstream.backends import BackendPool
from proxy.upstream.httpx_legs import HttpxLegs
from proxy.upstream.legs import LegTimeouts
from tests.fakes.mock_vllm import MockCluster
from tests.fakes.redis_server import RedisServer
from tests.proxy.helpers import FakeClock
from tests.proxy.router_harness import ROLES, Harness, chat, text_of

D1 = "http://d1"
# More ids than a long conversation holds, some beyond 16 bits (vocabularies of 150k+).
IDS = array("q", [(i * 7919) % 200_000 for i in range(40_000)])
PARAMS = {"do_remote_decode": True, "remote_engine_id": "engine-d1", "remote_block_ids": [1, 2],
          "remote_request_id": "r1", "remote_host": "10.0.0.1", "remote_port": 5600,
          "remote_num_tokens": len(IDS)}


class Wall:
    """A wall clock that can be moved ahead of the real one (Redis expires keys on its own)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


@contextlib.asynccontextmanager
async def workers(url: str, n: int = 2, probe: float = 0.05, wall: Wall | None = None
                  ) -> AsyncIterator[list[tuple[RedisReadbacks, FakeClock]]]:
    """n processes' books on one Redis: each its own store (client) and router clock."""
    stores = [RedisStore(url, 3600.0, 1000, time.monotonic, probe_interval=probe)
              for _ in range(n)]
    for store in stores:
        await store.start()
    try:
        books = []
        for i, store in enumerate(stores):
            clock = FakeClock(1000.0 + 500.0 * i)  # no two processes share a monotonic clock
            books.append((RedisReadbacks(store, clock, wall or time.time), clock))
        yield books
    finally:
        for store in stores:
            await store.close()


def lookup(session_id: str = "s1", digest: str = "dg", decode: str | None = D1,
           continuation: bool = True) -> Lookup:
    return Lookup(Session(session_id, "ns", True, decode, "http://p1", 1, 0.0,
                          Held(4, digest, len(IDS))), continuation)


def held(clock: FakeClock, ttl: float = 60.0, decode: str = D1) -> HeldKV:
    return HeldKV(PARAMS, decode, IDS, clock() + ttl)


async def test_an_entry_round_trips_and_is_taken_once(redis_server: RedisServer) -> None:
    async with workers(redis_server.url, n=1) as [(book, clock)]:
        await book.put("s1", "dg", held(clock, ttl=60.0))
        status = await book.status(lookup())
        still = await book.status(lookup())
        taken = await book.take(lookup())
        again = await book.take(lookup())
        after = await book.status(lookup())
    assert (status, still) == (None, None)  # a status reads, never takes
    assert isinstance(taken, HeldKV)
    assert taken.params == PARAMS and taken.decode == D1
    assert taken.token_ids == IDS and taken.token_ids.typecode == "q"
    assert taken.expires == pytest.approx(clock() + 60.0, abs=1.0)  # back on the router's clock
    assert (again, after) == (Reason.READBACK_MISSING, Reason.READBACK_MISSING)


async def test_one_worker_puts_another_takes_and_only_one_ever_gets_it(
        redis_server: RedisServer) -> None:
    async with workers(redis_server.url) as [(a, a_clock), (b, b_clock)]:
        await a.put("s1", "dg", held(a_clock, ttl=60.0))
        seen_by_b = await b.status(lookup())
        taken = await b.take(lookup())
        left_for_a = await a.take(lookup())
        winners = []
        for i in range(20):  # both at once, each time: exactly one gets D's blocks
            await a.put(f"race{i}", "dg", held(a_clock))
            both = await asyncio.gather(a.take(lookup(f"race{i}")), b.take(lookup(f"race{i}")))
            winners.append(sum(isinstance(x, HeldKV) for x in both))
    assert seen_by_b is None
    assert isinstance(taken, HeldKV) and taken.token_ids == IDS
    # a's clock is 500 s behind b's: the expiry is converted through the wall clock.
    assert taken.expires == pytest.approx(b_clock() + 60.0, abs=1.0)
    assert left_for_a is Reason.READBACK_MISSING
    assert winners == [1] * 20


async def test_another_text_finds_nothing_and_takes_nothing(redis_server: RedisServer) -> None:
    async with workers(redis_server.url, n=1) as [(book, clock)]:
        await book.put("s1", "dg", held(clock))
        other_text = (await book.status(lookup(digest="other")),
                      await book.take(lookup(digest="other")))
        other_session = await book.take(lookup("s2"))
        new_branch = (await book.status(lookup(continuation=False)),
                      await book.take(lookup(continuation=False)))
        taken = await book.take(lookup())
    assert other_text == (Reason.READBACK_MISSING, Reason.READBACK_MISSING)
    assert other_session is Reason.READBACK_MISSING
    assert new_branch == (Reason.READBACK_MISSING, Reason.READBACK_MISSING)
    assert isinstance(taken, HeldKV)  # the misses left it where it was


async def test_a_newer_text_replaces_the_entry_and_discard_drops_it(
        redis_server: RedisServer) -> None:
    async with workers(redis_server.url) as [(a, a_clock), (b, b_clock)]:
        await a.put("s1", "old", held(a_clock))
        await b.put("s1", "new", held(b_clock))
        old = await a.status(lookup(digest="old"))
        new = await a.status(lookup(digest="new"))
        await b.discard("s1")
        discarded = await a.status(lookup(digest="new"))
    assert (old, new, discarded) == (Reason.READBACK_MISSING, None, Reason.READBACK_MISSING)


async def test_an_expired_entry_says_so_and_is_gone_once_taken(
        redis_server: RedisServer) -> None:
    wall = Wall()
    async with workers(redis_server.url, n=1, wall=wall) as [(book, clock)]:
        await book.put("s1", "dg", held(clock, ttl=30.0))
        client = aioredis.Redis.from_url(redis_server.url)
        ttl_ms = await client.pttl(f"{PREFIX}r:s1")
        await client.aclose()
        fresh = await book.status(lookup())
        wall.ahead = 31.0  # past the expiry; Redis still keeps it EXPIRED_KEPT_S longer
        status = await book.status(lookup())
        taken = await book.take(lookup())
        after = await book.status(lookup())
    assert abs(ttl_ms - (30.0 + EXPIRED_KEPT_S) * 1000) < 2000  # Redis forgets it by itself
    assert fresh is None
    assert (status, taken, after) == (Reason.READBACK_EXPIRED, Reason.READBACK_EXPIRED,
                                      Reason.READBACK_MISSING)


async def test_redis_forgets_an_entry_long_expired(redis_server: RedisServer) -> None:
    async with workers(redis_server.url, n=1) as [(book, clock)]:
        await book.put("s1", "dg", held(clock, ttl=-EXPIRED_KEPT_S - 1.0))
        client = aioredis.Redis.from_url(redis_server.url)
        keys = await client.keys(f"{PREFIX}r:*")
        await client.aclose()
        status = await book.status(lookup())
    assert keys == [] and status is Reason.READBACK_MISSING


async def test_another_ds_entry_is_not_read_and_is_gone(redis_server: RedisServer) -> None:
    async with workers(redis_server.url, n=1) as [(book, clock)]:
        await book.put("s1", "dg", held(clock, decode="http://d2"))
        moved = await book.take(lookup(decode=D1))  # the session moved to d1 since
        later = await book.take(lookup(decode="http://d2"))
    assert (moved, later) == (Reason.READBACK_MISSING, Reason.READBACK_MISSING)


async def test_redis_down_answers_missing_without_errors_and_logs_once(
        redis_server: RedisServer, caplog: Any) -> None:
    # A slow probe: the store still thinks it is up, so every command meets the outage.
    async with workers(redis_server.url, n=1, probe=3600.0) as [(book, clock)]:
        await book.put("s1", "dg", held(clock))
        redis_server.stop()
        down = []
        for _ in range(3):
            down += [await book.status(lookup()), await book.take(lookup())]
            await book.put("s1", "dg", held(clock))
            await book.discard("s1")
        redis_server.start()  # same port, empty
        back = None
        for _ in range(20):  # the pool drops its dead connections as they fail
            await book.put("s2", "dg", held(clock))
            back = await book.take(lookup("s2"))
            if isinstance(back, HeldKV):
                break
    assert down == [Reason.READBACK_MISSING] * 6
    assert isinstance(back, HeldKV)
    lines = [r.getMessage() for r in caplog.records if "readback book" in r.getMessage()]
    assert len(lines) == 1 and "unreachable" in lines[0]


async def test_a_store_known_down_is_not_asked(tmp_path: Any, caplog: Any) -> None:
    server = RedisServer(tmp_path)  # never started
    async with workers(server.url, n=1) as [(book, clock)]:
        await book.put("s1", "dg", held(clock))
        answers = (await book.status(lookup()), await book.take(lookup()))
        await book.discard("s1")
    assert answers == (Reason.READBACK_MISSING, Reason.READBACK_MISSING)
    assert not [r for r in caplog.records if "readback book" in r.getMessage()]


def test_the_app_keeps_the_book_beside_the_sessions(redis_server: RedisServer) -> None:
    nodes = [NodeSpec("http://p1", Role.PREFILL), NodeSpec("http://d1", Role.DECODE)]
    shared = build_state(ProxyConfig(nodes=nodes, policy=PolicyConfig(Policy.PD),
                                     session_store=redis_server.url, kv_readback_ttl=60.0),
                         time.monotonic)
    local = build_state(ProxyConfig(nodes=nodes, policy=PolicyConfig(Policy.PD),
                                    kv_readback_ttl=60.0), time.monotonic)
    assert isinstance(shared.router.readback, RedisReadbacks)
    assert isinstance(local.router.readback, MemoryReadbacks)


LONG = " ".join(f"word{i}" for i in range(MIN_READBACK_TOKENS + 10))  # enough to read back


@contextlib.asynccontextmanager
async def routers_on_one_redis(url: str, cluster: MockCluster, n: int = 2,
                               policy: Policy = Policy.PD) -> AsyncIterator[list[Harness]]:
    """n Routers (n workers) over one mock cluster, their sessions and books on one Redis."""
    harnesses, stores = [], []
    for _ in range(n):
        clock = FakeClock(1000.0)
        pool = BackendPool([NodeSpec(node.url, ROLES[name[0]])
                            for name, node in cluster.nodes.items()], clock=clock)
        store = RedisStore(url, 3600.0, 1000, clock)
        await store.start()
        stores.append(store)
        router = Router(pool, store, RoutingPolicy(PolicyConfig(policy)), token_counter(None),
                        ProxyMetrics(policy.value, store.live), RateMeter(30.0, clock), clock)
        router.legs = HttpxLegs(cluster.transport, LegTimeouts(connect=5.0, read=5.0))
        router.readback, router.readback_ttl = RedisReadbacks(store, clock), 60.0
        harnesses.append(Harness(router, cluster, clock))
    try:
        yield harnesses
    finally:
        for h, store in zip(harnesses, stores, strict=True):
            assert h.router.legs is not None
            await h.router.legs.aclose()
            await store.close()


async def test_a_readback_recorded_by_one_worker_is_read_by_another(
        redis_server: RedisServer) -> None:
    cluster = MockCluster("p1", "d1")
    cluster["d1"].keeps_readback = True
    # A policy that reads back: under any other D keeps nothing (docs/readback.md).
    async with routers_on_one_redis(redis_server.url, cluster, policy=Policy.READBACK) as (a, b):
        _, content = await a.ask(chat(LONG))  # turn 1 on worker a: D keeps its blocks
        body = chat(LONG, text_of(content), "And then?")
        reply, _ = await b.ask(body, forced=RouteKind.READBACK)  # turn 2 on worker b
        retry, _ = await a.ask(body, forced=RouteKind.READBACK)  # the same turn again, on a
        p_legs = [r for r in cluster["p1"].received if r.path != "/tokenize"]
        d_first = cluster["d1"].received[0]
    assert reply.status == 200 and reply.headers["x-ppd-route"] == "readback"
    assert reply.headers["x-ppd-turn"] == "2"
    params = p_legs[1].body["kv_transfer_params"]
    assert params["remote_engine_id"] == "engine-d1"
    assert params["remote_request_id"] == d_first.headers["x-request-id"]
    assert b.router.metrics.stats()["readback"]["served"] == 1
    # b took the entry: nobody reads D's blocks twice (b's turn 2 kept new blocks for turn 3).
    assert retry.headers["x-ppd-route"] == "pd"
    assert a.router.metrics.stats()["readback"]["fallbacks"] == {"readback_missing": 1}

"""Issue #45, failure 15 (the store), in a real redis-server: records and readback entries
someone else wrote are checked when read - dropped and counted, never a 500 - and a long
transcript's fetch stays bounded."""

from __future__ import annotations

import json
import time

import redis.asyncio as aioredis

from proxy.sessions.redis_readbacks import RedisReadbacks
from proxy.sessions.redis_store import PREFIX, RedisStore
from proxy.sessions.session import ChatTranscript
from tests.fakes.redis_server import RedisServer
from tests.proxy.helpers import FakeClock
from tests.scale.test_redis_readbacks import PARAMS, held, lookup


def messages(n: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
            for i in range(n)]


async def test_bad_records_are_dropped_and_counted(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, 3600.0, 1000, time.monotonic, probe_interval=3600)
    await store.start()
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        first = await store.resolve(ChatTranscript(messages(3)))
        assert await store.record(first, None)
        # Someone rewrites the session with fields this proxy never wrote.
        await client.hset(f"{PREFIX}s:{first.session.id}",
                          mapping={"turns": "many", "last_access": "nan"})
        assert await store.snapshot() == []  # /sessions: the bad record left out, no 500
        assert store.records_rejected == 1
        fresh = RedisStore(redis_server.url, 3600.0, 1000, time.monotonic, probe_interval=3600)
        await fresh.start()
        try:
            again = await fresh.resolve(ChatTranscript(messages(3)))
            assert again.session.turns == 0 and fresh.records_rejected == 1
        finally:
            await fresh.close()
    finally:
        await client.aclose()
        await store.close()


async def test_a_forged_readback_entry_never_reaches_p(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, 3600.0, 1000, time.monotonic, probe_interval=3600)
    await store.start()
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        clock = FakeClock(1000.0)
        book = RedisReadbacks(store, clock)
        await book.put("s1", "dg", held(clock))
        forged = {**PARAMS, "remote_block_ids": list(range(300_000)), "remote_host": "10.6.6.6"}
        await client.hset(f"{PREFIX}r:s1", "p", json.dumps(forged))
        taken = await book.take(lookup())
        assert taken.__class__.__name__ == "Reason"  # missing: the turn goes P->D
        assert store.records_rejected == 1
    finally:
        await client.aclose()
        await store.close()

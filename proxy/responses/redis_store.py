"""Responses and conversations in Redis/Valkey (the `--session-store` the sessions use).

Every worker and proxy on the store reads and continues every response. Layout (prefix
`ppd:resp:`): `r:ID` the response's record; `r:ID:claim` the first turn that continued it;
`c:ID` a conversation's object, `c:ID:items` its items (a list), `c:ID:bytes` their size;
`order` a sorted set of every record by write time, for `--max-responses` (oldest written
first out, with its keys). Every key expires `--response-ttl` after it was written (PX, so
an idle record needs no process to forget it); an expired key's `order` member is pruned at
the next write. Each write is one Lua script: a reader never sees half a record. A store that
cannot be reached answers 503 (`StoreUnavailable`): stored state cannot be guessed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from proxy.responses.store import Bounds, RecordTooLarge, ResponseStore, StoreUnavailable, encode
from proxy.shared.json_codec import dumps, loads
from proxy.shared.redact import redacted_url

PREFIX = "ppd:resp:"
COMMAND_TIMEOUT_S = 2.0
_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
T = TypeVar("T")

# KEYS: none (derived). ARGV: prefix, member, ttl ms, max records, now ms, then key/value
# pairs to SET -> the records kept. Adds the member to `order`, prunes what expired and the
# oldest past the bound.
_WRITE = """
local p, member, ttl, max, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]),
  tonumber(ARGV[5])
for i = 6, #ARGV, 2 do redis.call('SET', p .. ARGV[i], ARGV[i + 1], 'PX', ttl) end
redis.call('ZADD', p .. 'order', now, member)
local function drop(m)
  redis.call('DEL', p .. m, p .. m .. ':claim', p .. m .. ':items', p .. m .. ':bytes')
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', p .. 'order', '-inf', now - ttl)) do
  drop(m)
end
redis.call('ZREMRANGEBYSCORE', p .. 'order', '-inf', now - ttl)
local over = redis.call('ZCARD', p .. 'order') - max
if over > 0 then
  local old = redis.call('ZPOPMIN', p .. 'order', over)
  for i = 1, #old, 2 do drop(old[i]) end
end
return redis.call('ZCARD', p .. 'order')
"""

# ARGV: prefix, conversation member (c:ID), ttl ms, max bytes, now ms, item payloads ->
# -1 gone, 0 over the size bound, 1 added (every key of the conversation re-armed).
_APPEND = """
local p, m, ttl, cap, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]),
  tonumber(ARGV[5])
if redis.call('EXISTS', p .. m) == 0 then return -1 end
local size = tonumber(redis.call('GET', p .. m .. ':bytes') or '0')
for i = 6, #ARGV do size = size + #ARGV[i] end
if size > cap then return 0 end
if #ARGV >= 6 then redis.call('RPUSH', p .. m .. ':items', unpack(ARGV, 6)) end
redis.call('SET', p .. m .. ':bytes', size, 'PX', ttl)
redis.call('PEXPIRE', p .. m, ttl)
redis.call('PEXPIRE', p .. m .. ':items', ttl)
redis.call('ZADD', p .. 'order', now, m)
return 1
"""

# ARGV: prefix, member, child -> a claim released only by the turn that holds it.
_RELEASE = """
if redis.call('GET', ARGV[1] .. ARGV[2] .. ':claim') == ARGV[3] then
  redis.call('DEL', ARGV[1] .. ARGV[2] .. ':claim')
end
return 1
"""


class RedisResponses(ResponseStore):
    """The records in Redis (see the module docstring)."""

    shared = True

    def __init__(self, url: str, bounds: Bounds,
                 clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self.bounds = bounds
        self._clock = clock  # wall time: every process on the store must agree on it
        self._client: aioredis.Redis | None = None
        self._scripts: dict[str, Any] = {}
        self._live = 0

    async def start(self) -> None:
        self._client = aioredis.Redis.from_url(self.url, socket_timeout=COMMAND_TIMEOUT_S,
                                               socket_connect_timeout=COMMAND_TIMEOUT_S)
        self._scripts = {name: self._client.register_script(source) for name, source in (
            ("write", _WRITE), ("append", _APPEND), ("release", _RELEASE))}

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def client(self) -> aioredis.Redis:
        if self._client is None:
            raise StoreUnavailable("the response store is not open")
        return self._client

    async def _run(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except _ERRORS as exc:
            raise StoreUnavailable(f"the response store {redacted_url(self.url)} cannot be "
                                   f"reached: {type(exc).__name__}") from None

    def _ttl_ms(self) -> int:
        return max(1, int(self.bounds.ttl_s * 1000))

    async def _write(self, member: str, *pairs: bytes | str) -> None:
        args = [PREFIX, member, self._ttl_ms(), self.bounds.max_records,
                int(self._clock() * 1000), *pairs]
        self._live = int(await self._run(lambda: self._scripts["write"](args=args)))

    async def put_response(self, response_id: str, record: dict[str, Any]) -> None:
        data = encode(record, self.bounds, f"response {response_id}")
        await self._write("r:" + response_id, "r:" + response_id, data)

    async def get_response(self, response_id: str) -> dict[str, Any] | None:
        data = await self._run(lambda: self.client.get(PREFIX + "r:" + response_id))
        return None if data is None else loads(data)

    async def delete_response(self, response_id: str) -> bool:
        member = "r:" + response_id

        async def delete() -> int:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(PREFIX + member, PREFIX + member + ":claim")
                pipe.zrem(PREFIX + "order", member)
                removed, _ = await pipe.execute()
            return int(removed)

        return await self._run(delete) > 0

    async def claim(self, response_id: str, child_id: str) -> bool:
        key = PREFIX + "r:" + response_id + ":claim"
        taken = await self._run(lambda: self.client.set(key, child_id, nx=True,
                                                        px=self._ttl_ms()))
        return bool(taken)

    async def release(self, response_id: str, child_id: str) -> None:
        args = [PREFIX, "r:" + response_id, child_id]
        await self._run(lambda: self._scripts["release"](args=args))

    async def put_conversation(self, conversation_id: str, obj: dict[str, Any],
                               items: list[dict[str, Any]]) -> None:
        member = "c:" + conversation_id
        await self._write(member, member, dumps(obj), member + ":bytes", "0")
        if items and not await self.append_items(conversation_id, items):
            raise StoreUnavailable(f"conversation {conversation_id} was evicted as it was made")

    async def get_conversation(self, conversation_id: str) -> dict[str, Any] | None:
        data = await self._run(lambda: self.client.get(PREFIX + "c:" + conversation_id))
        return None if data is None else loads(data)

    async def conversation_items(self, conversation_id: str) -> list[dict[str, Any]] | None:
        key = PREFIX + "c:" + conversation_id

        async def read() -> tuple[int, list[bytes]]:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.exists(key)
                pipe.lrange(key + ":items", 0, -1)
                exists, items = await pipe.execute()
            return int(exists), items

        exists, items = await self._run(read)
        return [loads(item) for item in items] if exists else None

    async def append_items(self, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        args = [PREFIX, "c:" + conversation_id, self._ttl_ms(), self.bounds.max_record_bytes,
                int(self._clock() * 1000), *(dumps(item) for item in items)]
        done = await self._run(lambda: self._scripts["append"](args=args))
        if int(done) == 0:
            raise RecordTooLarge(f"conversation {conversation_id} would be over the limit of "
                                 f"{self.bounds.max_record_bytes} bytes (--max-response-bytes)")
        return int(done) == 1

    async def delete_item(self, conversation_id: str, item_id: str) -> bool | None:
        items = await self.conversation_items(conversation_id)
        if items is None:
            return None
        key = PREFIX + "c:" + conversation_id + ":items"
        found = next((item for item in items if item.get("id") == item_id), None)
        if found is None:
            return False
        data = dumps(found)

        async def remove() -> None:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.lrem(key, 1, data)  # type: ignore[arg-type]  # bytes are what it holds
                pipe.decrby(PREFIX + "c:" + conversation_id + ":bytes", len(data))
                await pipe.execute()

        await self._run(remove)
        return True

    async def delete_conversation(self, conversation_id: str) -> bool:
        member = "c:" + conversation_id

        async def delete() -> int:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(PREFIX + member, PREFIX + member + ":items",
                            PREFIX + member + ":bytes")
                pipe.zrem(PREFIX + "order", member)
                removed, _ = await pipe.execute()
            return int(removed)

        return await self._run(delete) > 0

    def live(self) -> int:
        return self._live

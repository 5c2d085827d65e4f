"""Sessions in Redis/Valkey, shared by every worker and replica (`--session-store redis://...`).

Layout (prefix `ppd:`; a standalone server, not a cluster: the scripts name keys they derive):
- `s:ID` hash: one session (namespace as `opening`, hashed, decode, prefill, turns,
  last_access, created and the held fingerprint hl/hd/ht);
- `h:NS:DIGEST` hash: the session (its fields and `id`) as it was when it recorded that text
  in namespace NS (`proxy.sessions.ledger` explains the index, forks included; an entry stays
  after its session moved on); `l:NS`: the held lengths of the namespace's entries; `o:NS` ->
  ID: its latest session, whose nodes a new branch starts on;
- `live`: sorted set ID -> expiry, for the live count and the admin snapshot;
- `k:ID` set: the index entries session ID recorded (what goes with it when it is evicted);
- `r:ID` hash: the blocks session ID's D keeps for a readback (`proxy.sessions.redis_readbacks`,
  through this store's client; they expire on their own clock, not with the session).
Every key expires `--session-ttl` after the session's last recorded turn (PEXPIRE in the
store, so an idle session needs no process to forget it), and the store holds at most
`--max-sessions` sessions: past that, the least recently recorded goes with its keys.

Reads (`resolve`) and writes (`record`, once per completed turn) are one Lua script each, so a
turn never sees half a write; the write is a compare-and-set on the turn count and held digest
the turn read, and the loser's turn stays unrecorded. Completions requests with a string
prompt need one more round trip first (their held lengths: a prompt's prefixes are hashed here).

A local cache (a `SessionLedger`) answers without a round trip when this process recorded the
session's previous turn and the request adds no reply after it (so no other process can have
recorded a later turn); anything else asks the store, and a lost compare-and-set evicts the
entry. If the store cannot be reached, every turn runs as a new conversation (P->D, never an
error) with one log line and `ppd_session_store_up` 0; a probe reconnects within
PROBE_INTERVAL_S of the store coming back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from proxy.sessions.ledger import SessionLedger, branch_id, fork, new_session
from proxy.sessions.redis_records import RecordError, decode_record
from proxy.sessions.session import (
    ChatTranscript,
    Held,
    Lookup,
    Session,
    Transcript,
    Version,
    namespace,
)
from proxy.sessions.store import SessionStore
from proxy.shared.redact import redacted_url as redacted

log = logging.getLogger("ppd.proxy")

PREFIX = "ppd:"
# How often a worker checks the store (reconnects, refreshes the live count).
PROBE_INTERVAL_S = 0.5
CONNECT_TIMEOUT_S = 0.5
COMMAND_TIMEOUT_S = 2.0
# The local cache holds at most this many sessions (the store holds them all).
CACHE_MAX = 100_000
SNAPSHOT_MAX = 10_000
# A chat of up to this many messages sends the digest of each of its prefixes in the fetch
# script (no extra round trip); a longer one asks first which lengths its namespace holds.
INLINE_DIGESTS = 256
# The most digests one fetch script looks up (the longest; a transcript held at a shorter
# prefix than all of them runs as a new conversation).
MAX_DIGESTS = 1024
_ERRORS = (RedisError, OSError, asyncio.TimeoutError)

# ARGV: prefix, namespace, candidate id ('' = none), digests longest first ->
# {1, point record, current record} for the entry of the longest digest held, else
# {0, home id, home record, 1 if the candidate id is taken}.
_FETCH = """
local p, ns = ARGV[1], ARGV[2]
for i = 4, #ARGV do
  local point = redis.call('HGETALL', p .. 'h:' .. ns .. ':' .. ARGV[i])
  if #point > 0 then
    local id = redis.call('HGET', p .. 'h:' .. ns .. ':' .. ARGV[i], 'id')
    return {1, point, redis.call('HGETALL', p .. 's:' .. id)}
  end
end
local home = redis.call('GET', p .. 'o:' .. ns) or ''
local rec = {}
if home ~= '' then rec = redis.call('HGETALL', p .. 's:' .. home) end
local taken = 0
if ARGV[3] ~= '' then taken = redis.call('EXISTS', p .. 's:' .. ARGV[3]) end
return {0, home, rec, taken}
"""

# ARGV: prefix, id, expected turns ('' = must not exist), expected held digest, ttl ms,
# namespace, max sessions, held length, held digest, then the record's field/value pairs ->
# 1 or 0. Past max sessions the least recently recorded are deleted with their keys (`k:ID`
# lists a session's index entries; an entry another session has since taken over is kept).
_COMMIT = """
local p, id = ARGV[1], ARGV[2]
local key = p .. 's:' .. id
local cur = redis.call('HMGET', key, 'turns', 'hd')
if ARGV[3] == '' then
  if cur[1] then return 0 end
elseif cur[1] ~= ARGV[3] or (cur[2] or '') ~= ARGV[4] then
  return 0
end
local ttl = tonumber(ARGV[5])
local ns, hl, hd = ARGV[6], ARGV[8], ARGV[9]
redis.call('DEL', key)
redis.call('HSET', key, unpack(ARGV, 10))
redis.call('PEXPIRE', key, ttl)
if hd ~= '' then
  local point = p .. 'h:' .. ns .. ':' .. hd
  redis.call('DEL', point)
  redis.call('HSET', point, 'id', id, unpack(ARGV, 10))
  redis.call('PEXPIRE', point, ttl)
  redis.call('SADD', p .. 'k:' .. id, point)
  redis.call('PEXPIRE', p .. 'k:' .. id, ttl)
  redis.call('SADD', p .. 'l:' .. ns, hl)
  redis.call('PEXPIRE', p .. 'l:' .. ns, ttl)
end
redis.call('SET', p .. 'o:' .. ns, id, 'PX', ttl)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', p .. 'live', now + ttl, id)
redis.call('ZREMRANGEBYSCORE', p .. 'live', '-inf', now)
redis.call('PEXPIRE', p .. 'live', ttl)
local over = redis.call('ZCARD', p .. 'live') - tonumber(ARGV[7])
if over > 0 then
  local gone = redis.call('ZPOPMIN', p .. 'live', over)
  for i = 1, #gone, 2 do
    local victim = gone[i]
    local vkey = p .. 's:' .. victim
    local vns = redis.call('HGET', vkey, 'opening')
    for _, vpoint in ipairs(redis.call('SMEMBERS', p .. 'k:' .. victim)) do
      if redis.call('HGET', vpoint, 'id') == victim then redis.call('DEL', vpoint) end
    end
    if vns and redis.call('GET', p .. 'o:' .. vns) == victim then
      -- the namespace's latest session: its others were recorded before, so went before
      redis.call('DEL', p .. 'o:' .. vns, p .. 'l:' .. vns)
    end
    redis.call('DEL', vkey, p .. 'k:' .. victim)
  end
end
return 1
"""

# ARGV: prefix, max -> the ids of live sessions (at most max).
_LIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[2] == '0' then return redis.call('ZCOUNT', ARGV[1] .. 'live', now, '+inf') end
return redis.call('ZRANGEBYSCORE', ARGV[1] .. 'live', now, '+inf', 'LIMIT', 0, ARGV[2])
"""


def _encode(session: Session) -> list[str]:
    held = session.held
    fields = {"opening": session.opening, "hashed": "1" if session.hashed else "0",
              "decode": session.decode or "", "prefill": session.prefill or "",
              "turns": str(session.turns), "last_access": repr(session.last_access),
              "created": repr(session.created), "hl": str(held.length) if held else "",
              "hd": held.digest if held else "", "ht": str(held.tokens) if held else ""}
    return [item for pair in fields.items() for item in pair]


def _field(flat: Any, key: str) -> Any:
    """One field of a flat HGETALL reply (RecordError when it has none)."""
    if isinstance(flat, list):
        for name, value in zip(flat[::2], flat[1::2], strict=False):
            if name == key:
                return value
    raise RecordError(f"record without {key!r}")


class RedisStore(SessionStore):
    """Sessions in Redis/Valkey with a local cache in front; degrades to P->D when down."""

    shared = True

    def __init__(self, url: str, ttl: float, max_sessions: int, clock: Callable[[], float],
                 prefix: str = PREFIX, probe_interval: float = PROBE_INTERVAL_S) -> None:
        self.url = url
        self._ttl = ttl
        self._ttl_ms = max(1, round(ttl * 1000))
        self._clock = clock
        self._max_sessions = max_sessions  # the store's bound: oldest recorded evicted first
        self._cache_size = min(max_sessions, CACHE_MAX)
        self._cache = SessionLedger(ttl, self._cache_size, clock)
        self._prefix = prefix
        self._probe_interval = probe_interval
        self._client: aioredis.Redis | None = None
        self._scripts: dict[str, Any] = {}
        self._probe: asyncio.Task[None] | None = None
        self._stopping: asyncio.Event | None = None
        self._up = False
        self._live = 0
        self.cache_hits = 0
        self.records_rejected = 0  # bad records read back and dropped

    @property
    def up(self) -> bool:
        return self._up

    @property
    def client(self) -> aioredis.Redis | None:
        """The store's connection pool (None before `start`), for what else is kept beside
        the sessions (`proxy.sessions.redis_readbacks`): one pool, and the probe's reconnect
        after an outage serves both. Strings come back decoded."""
        return self._client

    @property
    def prefix(self) -> str:
        """The prefix of every key the store and what is kept beside it write."""
        return self._prefix

    async def start(self) -> None:
        self._client = aioredis.Redis.from_url(
            self.url, decode_responses=True, socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=COMMAND_TIMEOUT_S, retry=Retry(NoBackoff(), 0))
        self._scripts = {name: self._client.register_script(source) for name, source in (
            ("fetch", _FETCH), ("commit", _COMMIT), ("count_live", _LIVE))}
        self._up = True
        await self._check()
        if self._up:
            log.info("session store %s: sessions shared with every process using it",
                     redacted(self.url))
        self._stopping = asyncio.Event()
        self._probe = asyncio.create_task(self._probe_forever(self._stopping))

    async def close(self) -> None:
        if self._probe is not None and self._stopping is not None:
            # The probe ends on its own: a cancel landing inside a redis command can be
            # swallowed (the client's timeout handling), which would leave it running.
            self._stopping.set()
            await asyncio.wait({self._probe}, timeout=COMMAND_TIMEOUT_S + 1)
            if not self._probe.done():
                self._probe.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._probe
        if self._client is not None:
            await self._client.aclose()

    async def resolve(self, transcript: Transcript, explicit_id: str | None = None) -> Lookup:
        cached = self._cache.resolve(transcript, explicit_id)
        held = cached.session.held
        if (cached.continuation and cached.version is not None and held is not None
                and transcript.one_turn_after(held)):
            self.cache_hits += 1
            return cached
        if self._up:
            try:
                return await self._fetch(transcript, explicit_id)
            except _ERRORS as exc:
                self._lost(exc)
        return Lookup(new_session(transcript, explicit_id, self._clock()), False)

    async def record(self, lookup: Lookup, held: Held | None) -> bool:
        if not self._up:
            return False
        session = lookup.recorded(held, time.time())
        version = lookup.version
        new_held = session.held
        try:
            done = await self._run("commit", [
                self._prefix, session.id, "" if version is None else str(version.turns),
                (version.digest or "") if version is not None else "", self._ttl_ms,
                session.opening, self._max_sessions,
                new_held.length if new_held else "", new_held.digest if new_held else "",
                *_encode(session)])
        except _ERRORS as exc:
            self._lost(exc)
            return False
        if done:
            self._cache.put(replace(session, last_access=self._clock()))
        else:
            self._cache.forget(session.id)
        return bool(done)

    async def snapshot(self) -> list[dict[str, Any]]:
        if not self._up or self._client is None:
            return []
        try:
            ids = await self._run("count_live", [self._prefix, SNAPSHOT_MAX])
            async with self._client.pipeline(transaction=False) as pipe:
                for session_id in ids:
                    pipe.hgetall(f"{self._prefix}s:{session_id}")
                records = await pipe.execute()
        except _ERRORS as exc:
            self._lost(exc)
            return []
        out = []
        for session_id, record in zip(ids, records, strict=True):
            if record:
                with contextlib.suppress(RecordError):  # counted by _decode: left out
                    out.append(self._decode(session_id,
                                            [x for kv in record.items() for x in kv]).as_dict())
        return out

    def live(self) -> int:
        return self._live

    async def _fetch(self, transcript: Transcript, explicit_id: str | None) -> Lookup:
        space = namespace(transcript, explicit_id)
        if not transcript.extendable:
            lengths: Sequence[int] = ()
        elif isinstance(transcript, ChatTranscript) and transcript.length <= INLINE_DIGESTS:
            lengths = range(1, transcript.length)
        else:  # a prompt or a long chat: hash only at the lengths its namespace's entries hold
            assert self._client is not None
            members = await self._client.smembers(f"{self._prefix}l:{space}")
            lengths = [int(n) for n in members
                       if isinstance(n, str) and n.isdigit() and len(n) < 16]
        matches = transcript.prefix_digests(lengths)
        # Longest first, at most MAX_DIGESTS: the script's work per request stays bounded
        # whatever the transcript's length (600k messages once blocked Redis for 2 s).
        digests = sorted(matches, key=matches.__getitem__, reverse=True)[:MAX_DIGESTS]
        found, *rest = await self._run("fetch", [self._prefix, space, explicit_id or "",
                                                 *digests])
        now = self._clock()
        try:
            if found:
                point_flat, current_flat = rest
                try:
                    session_id = _field(point_flat, "id")
                except RecordError as exc:
                    self._rejected(exc)
                    raise
                point = self._decode(session_id, point_flat)
                current = self._decode(session_id, current_flat) if current_flat else None
                if current is not None and current.held == point.held:
                    return Lookup(current, True, Version.of(current))
                return Lookup(fork(point, branch_id(explicit_id, transcript), now), True)
            home_id, home_flat, taken = rest
            home = self._decode(home_id, home_flat) if home_flat else None
        except RecordError:  # dropped and counted: the turn runs as a new conversation
            return Lookup(new_session(transcript, explicit_id, now), False)
        session_id = branch_id(explicit_id, transcript) if taken else None
        return Lookup(new_session(transcript, explicit_id, now, home, session_id), False)

    def _decode(self, session_id: Any, flat: Any) -> Session:
        """A stored record as a session; a bad one is counted and raised (RecordError)."""
        try:
            if not isinstance(flat, list):
                raise RecordError("record is not a list of fields")
            return decode_record(session_id, flat)
        except RecordError as exc:
            self._rejected(exc)
            raise

    def _rejected(self, exc: RecordError) -> None:
        self.records_rejected += 1
        if self.records_rejected & (self.records_rejected - 1) == 0:  # 1st, 2nd, 4th...
            log.warning("session store %s: dropped a bad record: %s (%d so far)",
                        redacted(self.url), exc, self.records_rejected)

    async def _run(self, script: str, args: list[Any]) -> Any:
        return await self._scripts[script](keys=[], args=args)

    def _lost(self, exc: BaseException) -> None:
        if not self._up:
            return
        self._up = False
        # What this process cached may be stale by the time the store is back.
        self._cache = SessionLedger(self._ttl, self._cache_size, self._clock)
        log.warning("session store %s unreachable (%s: %s): every turn runs P->D as a new "
                    "conversation until it is back", redacted(self.url), type(exc).__name__,
                    exc)

    async def _check(self) -> None:
        try:
            if not self._up and self._client is not None:
                # Pooled connections from before the loss are dead: drop them all, or each
                # would fail one request after the store is back.
                await self._client.connection_pool.disconnect()
            self._live = int(await self._run("count_live", [self._prefix, 0]))
        except _ERRORS as exc:
            self._lost(exc)
            return
        if not self._up:
            self._up = True
            log.warning("session store %s is back: sessions are shared again",
                        redacted(self.url))

    async def _probe_forever(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self._probe_interval)
            if not stopping.is_set():
                await self._check()

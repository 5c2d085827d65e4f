"""The readback book in Redis/Valkey, beside the sessions: whichever worker or replica serves a
session's next turn takes the entry another one recorded (`--workers N`, `--session-store
redis://...`).

Layout (the session store's prefix, `ppd:`): `r:ID` hash, one per session: `d` the digest of
the text D holds, `u` D's url, `p` D's kv_transfer_params (JSON), `t` the ids of the tokens
D's blocks hold (packed int32, little-endian: 30k ids are 120 KB, a third of their JSON) and
`x` when the proxy stops offering them, in wall-clock seconds. Processes share no monotonic
clock: the router's (`HeldKV.expires`) is converted at this boundary, so replicas need
synchronised clocks (NTP) for the expiry to hold across machines. The key expires
EXPIRED_KEPT_S after `x` (PEXPIREAT): Redis forgets an entry no turn took, and bounds the book
by time where the memory one is bounded by count.

`take` is one Lua script that returns the entry and deletes it only when its digest is the
session's, so of two workers (or two concurrent turns) at most one gets D's blocks; an entry
for another text stays, as in the memory book. `status` reads the digest and expiry only.

It uses the session store's client (`RedisStore.client`): while the store is down nothing is
asked and every turn is `readback_missing` (P->D, never an error), `put` and `discard` are
dropped; a command that fails logs one line until one succeeds again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from array import array
from collections.abc import Callable
from typing import Any

from redis.client import NEVER_DECODE
from redis.exceptions import RedisError

from proxy.readback.protocol import HeldKV, plausible_params
from proxy.sessions.readback_book import held_digest, on_sessions_decode
from proxy.sessions.readbacks import Readbacks
from proxy.sessions.redis_store import RedisStore
from proxy.sessions.session import Lookup
from proxy.shared.json_codec import dumps, exact_loads
from proxy.shared.redact import redacted_url as redacted
from proxy.shared.vocabulary import Reason

log = logging.getLogger("ppd.proxy")

# How long Redis keeps an entry past its expiry: a turn that comes that much too late is told
# `readback_expired` (as the memory book would), not `readback_missing`.
EXPIRED_KEPT_S = 60.0
_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
# Entries that cannot be read back (written by another version, say) count as missing.
_BAD_ENTRY = (ValueError, TypeError, UnicodeDecodeError)
# An entry read back is checked before its params go to P (counted with the store's bad
# records, ppd_store_records_rejected_total): at most 1M token ids, 1 MB of params.
MAX_IDS_BYTES = 4 * 1024 * 1024
MAX_PARAMS_BYTES = 1024 * 1024

# KEYS: the entry; ARGV: the session's held digest -> {} when there is no entry for that text
# (left as it is), else {expiry, D's url, D's params, token ids}, and the entry is gone.
_TAKE = """
local e = redis.call('HMGET', KEYS[1], 'd', 'x', 'u', 'p', 't')
if e[1] ~= ARGV[1] then return {} end
redis.call('DEL', KEYS[1])
return {e[2], e[3], e[4], e[5]}
"""


def pack_ids(ids: array[int]) -> bytes:
    """Token ids as little-endian int32 (OverflowError: an id no vocabulary has)."""
    packed = array("i", ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack_ids(data: bytes) -> array[int]:
    """The ids `pack_ids` packed, as the proxy holds them (`HeldKV.token_ids`)."""
    packed = array("i")
    packed.frombytes(data)
    if sys.byteorder == "big":
        packed.byteswap()
    return array("q", packed)


class RedisReadbacks(Readbacks):
    """Each session's latest HeldKV in the session store's Redis; `clock` is the router's,
    `wall` the clock every process shares."""

    def __init__(self, store: RedisStore, clock: Callable[[], float],
                 wall: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._wall = wall
        self._failing = False

    async def status(self, lookup: Lookup) -> Reason | None:
        digest = held_digest(lookup)
        if digest is None:
            return Reason.READBACK_MISSING
        key = self._key(lookup.session.id)
        found = await self._call(lambda client: client.hmget(key, "d", "x"))
        if found is None or found[0] != digest:
            return Reason.READBACK_MISSING
        try:
            expires = float(found[1])
        except _BAD_ENTRY:
            return Reason.READBACK_MISSING
        return Reason.READBACK_EXPIRED if self._wall() >= expires else None

    async def take(self, lookup: Lookup) -> HeldKV | Reason:
        digest = held_digest(lookup)
        if digest is None:
            return Reason.READBACK_MISSING
        # The ids are bytes, not text: this reply is left undecoded (as redis-py's DUMP does).
        found = await self._call(lambda client: client.execute_command(
            "EVAL", _TAKE, 1, self._key(lookup.session.id), digest, **{NEVER_DECODE: []}))
        if not found:
            return Reason.READBACK_MISSING
        try:
            expiry, url, params, ids = found
            wall_expires, now = float(expiry), self._wall()
            if now >= wall_expires:
                return Reason.READBACK_EXPIRED  # gone all the same, as from the memory book
            if len(ids) > MAX_IDS_BYTES or len(params) > MAX_PARAMS_BYTES \
                    or not math.isfinite(wall_expires):
                raise ValueError("an entry over its bounds")
            held = HeldKV(exact_loads(params), url.decode(), unpack_ids(ids),
                          self._clock() + wall_expires - now)
            # The store is shared: what goes to P is checked as D's own answer was.
            if not isinstance(held.params, dict) or not plausible_params(
                    held.params, held.decode, held.tokens):
                raise ValueError("implausible readback params")
        except _BAD_ENTRY:
            self._store.records_rejected += 1
            return Reason.READBACK_MISSING
        return on_sessions_decode(held, lookup)

    async def put(self, session_id: str, digest: str, held: HeldKV) -> None:
        try:
            ids = pack_ids(held.token_ids)
        except OverflowError:
            return  # no entry: the next turn goes P->D, never reads what was not kept
        wall_expires = self._wall() + held.expires - self._clock()
        entry = {"d": digest, "u": held.decode, "p": dumps(held.params), "t": ids,
                 "x": repr(wall_expires)}
        key = self._key(session_id)

        async def write(client: Any) -> Any:
            async with client.pipeline(transaction=True) as pipe:  # never a key that lives on
                pipe.hset(key, mapping=entry)
                pipe.pexpireat(key, round((wall_expires + EXPIRED_KEPT_S) * 1000))
                return await pipe.execute()

        await self._call(write)

    async def discard(self, session_id: str) -> None:
        await self._call(lambda client: client.delete(self._key(session_id)))

    def _key(self, session_id: str) -> str:
        return f"{self._store.prefix}r:{session_id}"

    async def _call(self, command: Callable[[Any], Any]) -> Any:
        """The command's answer, None while the store is down or when the command fails."""
        client = self._store.client
        if client is None or not self._store.up:
            return None  # the store logged the outage; its probe says when it is back
        try:
            answer = await command(client)
        except _ERRORS as exc:
            if not self._failing:
                self._failing = True
                log.warning("readback book in %s unreachable (%s: %s): turns that could read "
                            "back run P->D until it answers", redacted(self._store.url),
                            type(exc).__name__, exc)
            return None
        self._failing = False
        return answer

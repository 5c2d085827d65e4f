"""RedisStore against a real redis-server: two stores stand for two processes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import redis.asyncio as aioredis

from proxy.sessions.redis_store import RedisStore, redacted
from proxy.sessions.session import Lookup, Transcript
from tests.fakes.redis_server import RedisServer


def msgs(*contents: str, system: str | None = None) -> list[dict[str, Any]]:
    roles = ("user", "assistant")
    out = [{"role": "system", "content": system}] if system else []
    return out + [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]


@contextlib.asynccontextmanager
async def stores(url: str, n: int = 2, ttl: float = 3600.0,
                 probe: float = 0.05) -> AsyncIterator[list[RedisStore]]:
    opened = [RedisStore(url, ttl, 1000, time.monotonic, probe_interval=probe) for _ in range(n)]
    for store in opened:
        await store.start()
    try:
        yield opened
    finally:
        for store in opened:
            await store.close()


async def turn(store: RedisStore, messages: list[dict[str, Any]], reply: str,
               explicit: str | None = None, node: str = "http://d1") -> tuple[Lookup, bool]:
    """Resolve and record one chat turn served on `node`; (the lookup as resolved, recorded)."""
    transcript = Transcript.from_chat(messages)
    lookup = await store.resolve(transcript, explicit)
    resolved = Lookup(replace(lookup.session), lookup.continuation, lookup.version)
    lookup.session.decode = node
    recorded = await store.record(lookup, transcript.held_after(reply, 10 * len(messages)))
    return resolved, recorded


async def test_a_conversation_continues_on_whichever_process_gets_the_turn(
        redis_server: RedisServer) -> None:
    async with stores(redis_server.url) as (a, b):
        first, _ = await turn(a, msgs("Hi", system="sys"), "Hello!", node="http://d2")
        second, _ = await turn(b, msgs("Hi", "Hello!", "More", system="sys"), "Sure.")
        third, _ = await turn(a, msgs("Hi", "Hello!", "More", "Sure.", "End", system="sys"), "k")
    assert first.turn == 1
    assert (second.turn, second.continuation, second.session.id) == (2, True, first.session.id)
    assert second.session.decode == "http://d2"  # the home D travelled with the session
    assert (third.turn, third.session.id) == (3, first.session.id)
    assert a.cache_hits == 0  # b recorded turn 2: a's cached turn 1 must not answer turn 3


async def test_a_process_that_served_the_previous_turn_answers_from_its_cache(
        redis_server: RedisServer) -> None:
    async with stores(redis_server.url, n=1) as (a,):
        await turn(a, msgs("Hi"), "Hello!")
        second, _ = await turn(a, msgs("Hi", "Hello!", "More"), "Sure.")
        explicit, _ = await turn(a, msgs("Yo"), "Hey", explicit="c1")
        explicit2, _ = await turn(a, msgs("Yo", "Hey", "again"), "ok", explicit="c1")
    assert second.turn == 2 and explicit2.turn == 2
    assert a.cache_hits == 2


async def test_completions_continue_across_processes(redis_server: RedisServer) -> None:
    opening = "System: be brief\nUser: hi\nAssistant:"
    async with stores(redis_server.url) as (a, b):
        ids = []
        for i in range(40):  # more branches of one opening than any bounded scan would see
            t = Transcript.from_prompt(opening)
            lookup = await a.resolve(t)
            assert await a.record(lookup, t.held_after(f" reply {i}", 5))
            ids.append(lookup.session.id)
        for i in (0, 39):
            t = Transcript.from_prompt(f"{opening} reply {i}\nUser: more\nAssistant:")
            lookup = await b.resolve(t)
            assert lookup.continuation and lookup.session.id == ids[i] and lookup.turn == 2


async def test_many_conversations_with_one_opening_continue(redis_server: RedisServer) -> None:
    async with stores(redis_server.url) as (a, b):
        firsts = [(await turn(a, msgs("Hi", system="You are helpful."), f"Hello {i}"))[0]
                  for i in range(100)]
        seconds = [(await turn(b, msgs("Hi", f"Hello {i}", "more", system="You are helpful."),
                               "r"))[0] for i in range(100)]
    assert len({f.session.id for f in firsts}) == 100
    assert [s.session.id for s in seconds] == [f.session.id for f in firsts]
    assert all(s.turn == 2 for s in seconds)


async def test_a_reused_conversation_id_with_another_opening_keeps_both(
        redis_server: RedisServer) -> None:
    async with stores(redis_server.url) as (a, b):
        await turn(a, msgs("Alice here"), "Hi Alice", explicit="chat-1")
        bob, _ = await turn(b, msgs("Bob here"), "Hi Bob", explicit="chat-1")
        alice2, _ = await turn(b, msgs("Alice here", "Hi Alice", "more"), "a", explicit="chat-1")
        bob2, _ = await turn(a, msgs("Bob here", "Hi Bob", "more"), "b", explicit="chat-1")
    assert bob.turn == 1 and bob.session.id.startswith("chat-1~")
    assert (alice2.session.id, alice2.turn) == ("chat-1", 2)
    assert (bob2.session.id, bob2.turn) == (bob.session.id, 2)


async def test_concurrent_turns_of_one_session_compare_and_set(
        redis_server: RedisServer) -> None:
    async with stores(redis_server.url) as (a, b):
        await turn(a, msgs("Hi"), "Hello", explicit="c")
        t = Transcript.from_chat(msgs("Hi", "Hello", "next"))
        from_a, from_b = await a.resolve(t, "c"), await b.resolve(t, "c")
        assert from_a.turn == from_b.turn == 2
        results = await asyncio.gather(a.record(from_a, t.held_after("from a", 9)),
                                       b.record(from_b, t.held_after("from b", 9)))
        assert sorted(results) == [False, True]
        winner = "from a" if results[0] else "from b"
        loser = "from b" if results[0] else "from a"
        # The winner's reply is what the session holds, from either process; the loser's
        # turn counts as unrecorded: its next turn continues from the text D still holds
        # (turn 1's), as a branch beside the session.
        for store in (a, b):
            lookup = await store.resolve(Transcript.from_chat(
                msgs("Hi", "Hello", "next", winner, "x")), "c")
            assert (lookup.session.id, lookup.continuation, lookup.turn) == ("c", True, 3)
            lost = await store.resolve(Transcript.from_chat(
                msgs("Hi", "Hello", "next", loser, "x")), "c")
            assert lost.continuation and lost.turn == 2 and lost.session.id.startswith("c~")


async def test_a_turn_read_before_another_process_moved_on_does_not_overwrite(
        redis_server: RedisServer) -> None:
    async with stores(redis_server.url) as (a, b):
        await turn(a, msgs("Hi"), "Hello")
        t = Transcript.from_chat(msgs("Hi", "Hello", "q"))
        stale = await a.resolve(t)  # answered from a's cache
        await turn(b, msgs("Hi", "Hello", "q"), "newer")
        assert not await a.record(stale, t.held_after("older", 9))
        after = await a.resolve(Transcript.from_chat(msgs("Hi", "Hello", "q", "newer", "z")))
    assert after.continuation and after.turn == 3


async def test_sessions_expire_in_the_store(redis_server: RedisServer) -> None:
    async with stores(redis_server.url, ttl=0.3) as (a, b):
        await turn(a, msgs("Hi"), "Hello", explicit="c")
        await turn(a, msgs("Hey"), "Hello")
        client = aioredis.Redis.from_url(redis_server.url)
        assert await client.dbsize() > 0
        await asyncio.sleep(0.6)
        keys = await client.keys("*")
        await client.aclose()
        lookup = await b.resolve(Transcript.from_chat(msgs("Hi", "Hello", "x")), "c")
    assert keys == []  # every key expired in the store itself
    assert not lookup.continuation


async def test_losing_the_store_degrades_to_new_conversations_and_recovers(
        redis_server: RedisServer, caplog: Any) -> None:
    async with stores(redis_server.url, n=1) as (a,):
        await turn(a, msgs("Hi"), "Hello", explicit="c")
        assert a.up
        redis_server.stop()
        for _ in range(200):  # the probe notices
            if not a.up:
                break
            await asyncio.sleep(0.05)
        down, recorded = await turn(a, msgs("Hi", "Hello", "x"), "y", explicit="c")
        assert (down.turn, recorded, a.up) == (1, False, False)
        again, _ = await turn(a, msgs("Hi", "Hello", "x"), "y", explicit="c")
        assert again.turn == 1
        redis_server.start()  # same port, empty
        for _ in range(200):
            if a.up:
                break
            await asyncio.sleep(0.05)
        assert a.up
        await turn(a, msgs("Hi"), "Hello", explicit="c")
        back, _ = await turn(a, msgs("Hi", "Hello", "x"), "y", explicit="c")
    assert back.turn == 2
    lines = [r.getMessage() for r in caplog.records if "session store" in r.getMessage()]
    assert sum("unreachable" in line for line in lines) == 1  # one line, not one per request
    assert sum("is back:" in line for line in lines) == 1


async def test_a_store_down_at_start_up_starts_degraded(tmp_path: Any) -> None:
    server = RedisServer(tmp_path)
    async with stores(server.url, n=1) as (a,):
        assert not a.up
        lookup, recorded = await turn(a, msgs("Hi"), "Hello")
        assert lookup.turn == 1 and not recorded
        assert await a.snapshot() == [] and a.live() == 0


def test_log_lines_hide_the_password() -> None:
    assert redacted("redis://user:s3cret@host:6379/0") == "redis://user:***@host:6379/0"
    assert redacted("redis://host:6379/0") == "redis://host:6379/0"


async def test_the_admin_snapshot_and_live_count_come_from_the_store(
        redis_server: RedisServer) -> None:
    async with stores(redis_server.url) as (a, b):
        await turn(a, msgs("Hi"), "Hello", explicit="c", node="http://d2")
        await turn(a, msgs("Yo"), "Hey")
        await asyncio.sleep(0.2)  # b's probe refreshes its count
        snapshot = await b.snapshot()
        live = b.live()
    assert live == 2
    assert sorted((s["id"] == "c", s["decode"], s["turns"]) for s in snapshot) == [
        (False, "http://d1", 1), (True, "http://d2", 1)]


async def test_a_forged_history_under_an_id_forks_and_a_reused_id_looks_unused(
        redis_server: RedisServer) -> None:
    # Issue 23, item 3, with the sessions shared by two processes.
    async with stores(redis_server.url) as (a, b):
        await turn(a, msgs("A's opening"), "A's reply", explicit="v2")
        forged, _ = await turn(b, msgs("A's opening", "forged", "B asks"), "B's reply",
                               explicit="v2")
        fresh, _ = await turn(b, msgs("A's opening", "forged", "B asks"), "B's reply",
                              explicit="never-used")
        a2, _ = await turn(b, msgs("A's opening", "A's reply", "A asks"), "more", explicit="v2")
    assert (forged.turn, fresh.turn) == (1, 1) and forged.session.id.startswith("v2~")
    assert (a2.session.id, a2.turn, a2.continuation) == ("v2", 2, True)


async def test_identical_histories_all_continue_across_processes(
        redis_server: RedisServer) -> None:
    # Issue 23, item 4: 20 conversations with the same opening and the same reply.
    async with stores(redis_server.url) as (a, b):
        for i in range(20):
            await turn((a, b)[i % 2], msgs("Hi", system="terse"), "Hello.")
        seconds = [await turn((b, a)[i % 2], msgs("Hi", "Hello.", f"q{i}", system="terse"),
                              f"r{i}") for i in range(20)]
    assert [(lk.continuation, lk.turn) for lk, _ in seconds] == [(True, 2)] * 20
    assert all(recorded for _, recorded in seconds)


async def test_the_store_holds_at_most_max_sessions_oldest_evicted_with_their_keys(
        redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, 3600.0, 5, time.monotonic, probe_interval=0.05)
    await store.start()
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        firsts = []
        for i in range(40):  # two turns each: index entries, homes and key lists too
            first, _ = await turn(store, msgs(f"conversation {i}"), "ok")
            await turn(store, msgs(f"conversation {i}", "ok", "more"), "fine")
            firsts.append(first.session.id)
        keys = await client.keys("ppd:*")
        live = await client.zrange("ppd:live", 0, -1)
        assert sorted(live) == sorted(firsts[-5:])  # the newest five, the rest evicted
        sessions = [k for k in keys if k.startswith("ppd:s:")]
        assert sorted(sessions) == sorted(f"ppd:s:{i}" for i in firsts[-5:])
        # Per kept session: s, k, o, l and its two index entries; plus `live`.
        assert len(keys) <= 5 * 6 + 1, sorted(keys)
        # An evicted conversation comes back as a new one (P->D), not as an error.
        again, _ = await turn(store, msgs("conversation 0", "ok", "more", "fine", "x"), "y")
        assert again.session.id != firsts[0] or not again.continuation
    finally:
        await client.aclose()
        await store.close()

"""Issue #45, failure 15 (the store): a record read back from Redis that holds no session is
dropped and counted, never a 500 - `resolve` and `/sessions` included."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from proxy.sessions.redis_records import RecordError, decode_record
from proxy.sessions.redis_store import RedisStore
from proxy.sessions.session import ChatTranscript
from proxy.sessions.store import watch_store

GOOD = ["opening", "ns", "hashed", "1", "decode", "http://d:1", "prefill", "",
        "turns", "3", "last_access", "12.5", "created", "10.0",
        "hl", "2", "hd", "ab" * 16, "ht", "40"]


def test_a_good_record_reads_back() -> None:
    session = decode_record("s1", GOOD)
    assert (session.decode, session.turns, session.held and session.held.tokens) == (
        "http://d:1", 3, 40)


@pytest.mark.parametrize("flat", [
    ["turns", "three"], ["turns", "-1"], ["turns", "9" * 40], ["turns", "1e9"],
    ["hd", "x", "hl", "2"],  # held digest without its length and tokens
    ["hd", "x", "hl", "2", "ht", "NaN"], ["last_access", "nan"], ["last_access", "inf"],
    ["created", "-5"], ["turns"], [b"turns", "1"], ["turns", 1], ["opening", "x" * 10_000],
])
def test_bad_records_are_refused(flat: list[Any]) -> None:
    with pytest.raises(RecordError):
        decode_record("s1", flat)


@pytest.mark.parametrize("session_id", [None, 5, "", "x" * 10_000])
def test_a_bad_session_id_is_refused(session_id: Any) -> None:
    with pytest.raises(RecordError):
        decode_record(session_id, GOOD)


def store_answering(answer: list[Any]) -> RedisStore:
    store = RedisStore("redis://127.0.0.1:1/0", 60.0, 100, lambda: 0.0)

    async def run(script: str, args: list[Any]) -> Any:
        return answer

    store._run = run  # type: ignore[method-assign]
    return store


@pytest.mark.parametrize("answer", [
    [1, ["id", "s1", "turns", "zz"], []],  # the index entry's record is bad
    [1, ["turns", "1"], []],  # an index entry without its session's id
    [1, ["id", "s1", *GOOD], ["turns", "NaN?"]],  # the current record is bad
    [0, "home", ["turns", "x"], 0],  # the namespace's latest session is bad
])
async def test_resolve_drops_a_bad_record_counts_it_and_starts_a_new_session(
        answer: list[Any]) -> None:
    store = store_answering(answer)
    registry = CollectorRegistry()
    watch_store(registry, store)
    transcript = ChatTranscript([{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "yo"},
                                 {"role": "user", "content": "again"}])
    lookup = await store._fetch(transcript, None)
    assert not lookup.continuation and lookup.session.turns == 0
    assert store.records_rejected == 1
    assert registry.get_sample_value("ppd_store_records_rejected_total") == 1.0


async def test_a_long_transcript_sends_a_bounded_number_of_digests() -> None:
    """Issue #45, failure 3: 600k messages once put 600k digests into one Lua script."""
    from proxy.sessions import redis_store

    sent: list[list[Any]] = []
    store = RedisStore("redis://127.0.0.1:1/0", 60.0, 100, lambda: 0.0)

    async def run(script: str, args: list[Any]) -> Any:
        sent.append(args)
        return [0, "", [], 0]

    class Members:
        async def smembers(self, key: str) -> set[str]:
            return {str(n) for n in range(1, 5000)} | {"junk", "-3", "9" * 30}

    store._run = run  # type: ignore[method-assign]
    store._client = Members()  # type: ignore[assignment]
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": str(i)}
                for i in range(20_001)]
    await store._fetch(ChatTranscript(messages), None)
    digests = sent[0][3:]
    assert len(digests) == redis_store.MAX_DIGESTS
    short = ChatTranscript(messages[:11])
    await store._fetch(short, None)
    assert len(sent[1][3:]) == 10  # a short chat: every prefix, no extra round trip

"""The embedded response store's bounds: count (oldest written first out), TTL, size; claims;
and a flood of 100,000 responses staying within docs/responses.md's memory bound."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import pytest

from proxy.responses.store import Bounds, MemoryResponses, RecordTooLarge
from tests.proxy.helpers import FakeClock

# docs/responses.md: the embedded store needs about the record's JSON plus this per record.
DOCUMENTED_OVERHEAD_BYTES = 400


def record(n: int, size: int = 100) -> dict[str, Any]:
    return {"response": {"id": f"resp_{n}"}, "session": f"s{n}", "input_at": 0,
            "output_at": 1, "items": [{"type": "message", "text": "x" * size}]}


async def test_the_oldest_written_goes_first_past_the_count() -> None:
    store = MemoryResponses(Bounds(max_records=3), FakeClock())
    for n in range(4):
        await store.put_response(f"r{n}", record(n))
    assert await store.get_response("r0") is None
    assert [await store.get_response(f"r{n}") is not None for n in (1, 2, 3)] == [True] * 3
    assert store.live() == 3
    # a conversation written to again is the newest
    await store.put_conversation("c", {"id": "c"}, [])
    await store.append_items("r1", [])  # not a conversation: nothing changes
    await store.append_items("c", [{"id": "i1"}])
    await store.put_response("r4", record(4))
    assert await store.get_conversation("c") == {"id": "c"}
    assert await store.get_response("r1") is None and await store.get_response("r2") is None


async def test_records_expire_after_the_ttl() -> None:
    clock = FakeClock()
    store = MemoryResponses(Bounds(ttl_s=10.0), clock)
    await store.put_response("r", record(0))
    await store.put_conversation("c", {"id": "c"}, [{"id": "i0"}])
    clock.now = 9.0
    await store.append_items("c", [{"id": "i1"}])  # re-arms the conversation only
    assert await store.get_response("r") is not None
    clock.now = 10.0
    assert await store.get_response("r") is None
    assert await store.conversation_items("c") == [{"id": "i0"}, {"id": "i1"}]
    clock.now = 19.0
    assert await store.get_conversation("c") is None and store.live() == 0


async def test_a_record_over_the_size_is_refused_and_not_kept() -> None:
    store = MemoryResponses(Bounds(max_record_bytes=500), FakeClock())
    with pytest.raises(RecordTooLarge) as refused:
        await store.put_response("r", record(0, size=600))
    assert refused.value.status == 413
    assert await store.get_response("r") is None
    await store.put_conversation("c", {"id": "c"}, [{"id": "i", "t": "x" * 300}])
    with pytest.raises(RecordTooLarge):
        await store.append_items("c", [{"id": "j", "t": "x" * 300}])
    assert len(await store.conversation_items("c") or []) == 1


async def test_one_turn_claims_a_response_and_only_it_releases_it() -> None:
    store = MemoryResponses(Bounds(), FakeClock())
    assert not await store.claim("missing", "a")
    await store.put_response("r", record(0))
    assert await store.claim("r", "a")
    assert not await store.claim("r", "b")
    await store.release("r", "b")
    assert not await store.claim("r", "c")
    await store.release("r", "a")
    assert await store.claim("r", "c")


async def test_conversation_items_are_deleted_one_by_one() -> None:
    store = MemoryResponses(Bounds(), FakeClock())
    await store.put_conversation("c", {"id": "c"}, [{"id": "a"}, {"id": "b"}])
    assert await store.delete_item("c", "a") is True
    assert await store.delete_item("c", "a") is False
    assert await store.delete_item("gone", "a") is None
    assert await store.conversation_items("c") == [{"id": "b"}]
    assert await store.delete_conversation("c") and not await store.delete_conversation("c")


async def test_a_flood_of_100000_responses_stays_within_the_documented_memory() -> None:
    bounds = Bounds(max_records=20_000)
    store = MemoryResponses(bounds, FakeClock())
    size = len(__import__("orjson").dumps(record(99_999)))
    gc.collect()
    tracemalloc.start()
    try:
        for n in range(100_000):
            await store.put_response(f"resp_{n:048x}", record(n))
        gc.collect()
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert store.live() == bounds.max_records
    assert await store.get_response(f"resp_{99_999:048x}") is not None
    assert await store.get_response(f"resp_{79_999:048x}") is None
    assert used <= bounds.max_records * (size + DOCUMENTED_OVERHEAD_BYTES), used

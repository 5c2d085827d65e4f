"""Responses in a real Redis: the same bounds as the embedded store, and two proxies on one
Redis continuing each other's responses and conversations."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from proxy.config.policy_config import Policy
from proxy.responses.redis_store import RedisResponses
from proxy.responses.store import Bounds, RecordTooLarge, StoreUnavailable
from tests.fakes.fake_vllm import FakeVLLM
from tests.fakes.redis_server import RedisServer, free_port
from tests.proxy.helpers import config_for, serve_proxy
from tests.proxy.responses.test_store import record


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path) as server:
        yield server


@contextlib.asynccontextmanager
async def opened(url: str, bounds: Bounds) -> AsyncIterator[RedisResponses]:
    store = RedisResponses(url, bounds)
    await store.start()
    try:
        yield store
    finally:
        await store.close()


async def test_bounds_claims_and_items_in_redis(redis_server: RedisServer) -> None:
    async with opened(redis_server.url, Bounds(max_records=3, max_record_bytes=600)) as store:
        for n in range(4):
            await store.put_response(f"r{n}", record(n))
        assert await store.get_response("r0") is None and store.live() == 3
        assert (await store.get_response("r3") or {})["session"] == "s3"
        with pytest.raises(RecordTooLarge):
            await store.put_response("big", record(9, size=700))
        assert await store.get_response("big") is None
        assert await store.claim("r3", "a") and not await store.claim("r3", "b")
        await store.release("r3", "b")
        assert not await store.claim("r3", "c")
        await store.release("r3", "a")
        assert await store.claim("r3", "c")
        await store.put_conversation("c", {"id": "c"}, [{"id": "i0"}])
        assert await store.append_items("c", [{"id": "i1"}, {"id": "i2"}])
        assert not await store.append_items("gone", [{"id": "x"}])
        with pytest.raises(RecordTooLarge):
            await store.append_items("c", [{"id": "i3", "t": "x" * 600}])
        assert await store.delete_item("c", "i1") is True
        assert [i["id"] for i in await store.conversation_items("c") or []] == ["i0", "i2"]
        assert await store.delete_response("r3") and not await store.delete_response("r3")
        assert await store.delete_conversation("c") and await store.get_conversation("c") is None


async def test_records_expire_in_redis(redis_server: RedisServer) -> None:
    async with opened(redis_server.url, Bounds(ttl_s=0.3)) as store:
        await store.put_response("r", record(0))
        assert await store.get_response("r") is not None
        await asyncio.sleep(0.5)
        assert await store.get_response("r") is None


async def test_an_unreachable_store_is_a_503() -> None:
    async with opened(f"redis://127.0.0.1:{free_port()}/0", Bounds()) as store:
        with pytest.raises(StoreUnavailable) as down:
            await store.get_response("r")
        assert down.value.status == 503


async def test_two_proxies_on_one_redis_continue_each_others_responses(
        redis_server: RedisServer, cluster: dict[str, FakeVLLM]) -> None:
    config = config_for(cluster, Policy.LOCAL, session_store=redis_server.url)
    async with serve_proxy(config) as one, serve_proxy(config) as two:
        proxies = [one, two]
        body = {"model": "fake-model", "input": "turn 1"}
        first = await one.client.post("/v1/responses", json=body)
        previous, session = first.json()["id"], first.headers["x-ppd-session"]
        for n in (2, 3, 4):
            answer = await proxies[(n - 1) % 2].client.post("/v1/responses", json={
                **body, "input": f"turn {n}", "previous_response_id": previous})
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-ppd-session"] == session
            assert (answer.headers["x-ppd-turn"], answer.headers["x-ppd-route"]) == (
                str(n), "local")
            previous = answer.json()["id"]
        assert (await one.client.get(f"/v1/responses/{previous}")).status_code == 200
        conversation = (await two.client.post("/v1/conversations", json={})).json()["id"]
        for n, proxy in enumerate((one, two), start=1):
            answer = await proxy.client.post("/v1/responses", json={
                **body, "conversation": conversation})
            assert answer.headers["x-ppd-turn"] == str(n)
        items = (await one.client.get(f"/v1/conversations/{conversation}/items")).json()
        assert len(items["data"]) == 4

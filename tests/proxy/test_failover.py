"""Failover, mid-stream failures and client disconnects (DESIGN "Backends")."""

from __future__ import annotations

import asyncio

import httpx

from proxy.config import Policy
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body, config_for, serve_proxy


async def test_decode_5xx_before_first_byte_fails_over_to_another_d(
        cluster: dict[str, FakeVLLM]) -> None:
    d1, d2 = cluster["d1"], cluster["d2"]
    async with serve_proxy(config_for(cluster, Policy.PD)) as proxy:
        first = await proxy.client.post("/v1/chat/completions", json=chat_body("Hello"))
        home, other = (d1, d2) if first.headers["x-ppd-decode"] == d1.url else (d2, d1)
        home.fail_with(503)
        reply = first.json()["choices"][0]["message"]["content"]
        second = await proxy.client.post("/v1/chat/completions",
                                         json=chat_body("Hello", reply, "again", stream=True))
        healthy = {n["url"]: n["healthy"] for n in proxy.state.pool.snapshot()}
        stats = (await proxy.client.get("/stats")).json()
    assert second.status_code == 200
    assert second.headers["x-ppd-decode"] == other.url
    assert second.headers["x-ppd-route"] == "pd"
    assert f'"id": "cmpl-{other.name}"' in second.text
    assert healthy[home.url] is False
    assert stats["failovers"] == 1
    # The retry carried P's fresh kv_transfer_params to the new D.
    assert other.completions[-1].body["kv_transfer_params"]["remote_engine_id"].startswith(
        "engine-p")


async def test_local_turn_on_a_failing_d_is_redone_as_pd(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.LOCAL)) as proxy:
        first = await proxy.client.post("/v1/chat/completions", json=chat_body("Hello"))
        home = next(n for n in cluster.values() if n.url == first.headers["x-ppd-decode"])
        home.fail_with(500)
        reply = first.json()["choices"][0]["message"]["content"]
        second = await proxy.client.post("/v1/chat/completions",
                                         json=chat_body("Hello", reply, "again"))
    assert second.status_code == 200
    assert second.headers["x-ppd-route"] == "pd"
    assert second.headers["x-ppd-decode"] != home.url


async def test_prefill_failure_is_retried_on_another_p(cluster: dict[str, FakeVLLM]) -> None:
    cluster["p1"].fail_with(500)
    cluster["p2"].fail_with(500)
    async with serve_proxy(config_for(cluster, Policy.PD)) as proxy:
        first = await proxy.client.post("/v1/chat/completions", json=chat_body("one"))
        cluster["p1"].fail_with(502)
        second = await proxy.client.post("/v1/chat/completions", json=chat_body("two"))
    # Both Ps fail the first request: nothing left to try.
    assert first.status_code == 502
    assert second.status_code == 200
    assert second.headers["x-ppd-prefill"] == cluster["p2"].url


async def test_upstream_dying_mid_stream_ends_the_stream_without_an_error_event(
        cluster: dict[str, FakeVLLM]) -> None:
    d1 = cluster["d1"]
    d1.faults.die_after_chunks = 2
    nodes = {"p1": cluster["p1"], "d1": d1}
    async with serve_proxy(config_for(nodes)) as proxy:
        response = await proxy.client.post("/v1/chat/completions",
                                           json=chat_body("Hi", stream=True))
        stats = (await proxy.client.get("/stats")).json()
        sessions = proxy.state.ledger.snapshot()
    assert response.status_code == 200
    assert response.text.count("data: ") == 2
    assert "error" not in response.text and "[DONE]" not in response.text
    assert stats["upstream_errors"] == {"decode:midstream": 1}
    assert sessions[0]["turns"] == 0  # an unfinished turn teaches the ledger nothing


async def test_client_disconnect_closes_the_upstream_stream(
        cluster: dict[str, FakeVLLM]) -> None:
    d1 = FakeVLLM("slow", reply=" ".join(["word"] * 200), chunk_delay_s=0.05)
    async with d1:
        nodes = {"p1": cluster["p1"], "d1": d1}
        async with serve_proxy(config_for(nodes)) as proxy, httpx.AsyncClient() as client:
            async with client.stream("POST", proxy.url + "/v1/chat/completions",
                                     json=chat_body("Hi", stream=True, max_tokens=500)) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    break  # read a little, then hang up
            for _ in range(100):
                if d1.streams_cancelled:
                    break
                await asyncio.sleep(0.02)
            in_flight = {n["url"]: n["in_flight"] for n in proxy.state.pool.snapshot()}
    assert d1.streams_cancelled == 1
    assert d1.streams_finished == 0
    assert in_flight[d1.url] == 0

"""Failover, mid-stream failures and client disconnects (docs/architecture.md, "Failover")."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import replace

import httpx
import openai
import pytest

from proxy import NodeSpec, Role
from proxy.config.policy_config import Policy
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import ProxyUnderTest, chat_body, config_for, serve_proxy


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
        nodes = {n["url"]: n for n in proxy.state.pool.snapshot()}
        stats = (await proxy.client.get("/stats")).json()
    assert second.status_code == 200
    assert second.headers["x-ppd-decode"] == other.url
    assert second.headers["x-ppd-route"] == "pd"
    assert f'"id":"chatcmpl-{other.name}-' in second.text  # the fake's ids name the node
    # One 5xx may be this request's alone: D stays in the pool, one strike on its breaker.
    assert nodes[home.url]["healthy"] is True
    assert (nodes[home.url]["circuit"], nodes[home.url]["failures"]) == ("closed", 1)
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


async def test_upstream_dying_mid_stream_ends_the_stream_with_an_error_event(
        cluster: dict[str, FakeVLLM]) -> None:
    d1 = cluster["d1"]
    d1.faults.die_after_chunks = 2
    nodes = {"p1": cluster["p1"], "d1": d1}
    async with serve_proxy(config_for(nodes)) as proxy:
        response = await proxy.client.post("/v1/chat/completions",
                                           json=chat_body("Hi", stream=True))
        stats = (await proxy.client.get("/stats")).json()
        sessions = await proxy.state.sessions.snapshot()
    assert response.status_code == 200
    assert response.text.count("data: ") == 3
    last = json.loads(response.text.split("\n\n")[-2][6:])
    assert last["error"]["code"] == "bad_gateway"
    assert "[DONE]" not in response.text
    assert stats["upstream_errors"] == {"decode:midstream": 1}
    assert sessions == []  # an unfinished turn teaches the session store nothing


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


async def test_a_client_leaving_while_p_prefills_cancels_the_p_leg(
        cluster: dict[str, FakeVLLM]) -> None:
    # No byte of the answer has been sent yet: only the server sees the client go (its
    # protocol's connection_lost, passed to the app as proxy.serving.server's DisconnectSignal).
    p1 = FakeVLLM("slow-p")
    p1.faults.hang = True
    async with p1:
        nodes = {"p1": p1, "d1": cluster["d1"]}
        async with serve_proxy(config_for(nodes, Policy.PD)) as proxy:
            async with httpx.AsyncClient() as client:
                request = asyncio.create_task(client.post(
                    proxy.url + "/v1/chat/completions", json=chat_body("Hi", stream=True)))
                for _ in range(250):
                    if p1.requests:
                        break
                    await asyncio.sleep(0.02)
                request.cancel()  # the client's connection closes
                with pytest.raises(asyncio.CancelledError):
                    await request
            for _ in range(250):
                if p1.requests_cancelled:
                    break
                await asyncio.sleep(0.02)
            gauges = await _settled(proxy)
    assert p1.requests_cancelled == 1
    assert not cluster["d1"].requests
    assert not any(gauges.values())


def _gauges(exposition: str) -> dict[str, float]:
    """The in-flight gauges of a /metrics page, by series."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in exposition.splitlines()
            if line.startswith(("ppd_requests_in_flight", "ppd_node_in_flight"))}


async def _settled(proxy: ProxyUnderTest) -> dict[str, float]:
    """The gauges once every count is back to zero (or after 2 s)."""
    for _ in range(100):
        gauges = _gauges((await proxy.client.get("/metrics")).text)
        if not any(gauges.values()):
            break
        await asyncio.sleep(0.02)
    return gauges


async def test_the_openai_client_raises_on_a_reply_cut_mid_stream(
        cluster: dict[str, FakeVLLM]) -> None:
    cluster["d1"].faults.die_after_chunks = 3
    nodes = {"p1": cluster["p1"], "d1": cluster["d1"]}
    async with serve_proxy(config_for(nodes)) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        parts = []
        with pytest.raises(openai.APIError, match="failed") as raised:
            stream = await client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "Hi"}],
                max_tokens=8, stream=True)
            async for chunk in stream:
                parts.append(chunk.choices[0].delta.content or "")
        await client.close()
        sessions = await proxy.state.sessions.snapshot()
        gauges = await _settled(proxy)
    assert "".join(parts) == "Hello from"  # what arrived before the cut
    assert raised.value.body == {"message": raised.value.message, "type": "upstream_error",
                                 "param": None, "code": "bad_gateway"}
    assert sessions == []
    assert not any(gauges.values())


async def test_a_client_leaving_during_the_p_leg_cancels_it(
        cluster: dict[str, FakeVLLM]) -> None:
    p1 = cluster["p1"]
    p1.faults.delay_s = 30
    nodes = {"p1": p1, "d1": cluster["d1"]}
    async with serve_proxy(config_for(nodes)) as proxy:
        with pytest.raises(httpx.ReadTimeout):
            await proxy.client.post("/v1/chat/completions", json=chat_body("Hi"), timeout=0.3)
        gauges = await _settled(proxy)
        for _ in range(100):
            if p1.requests_cancelled:
                break
            await asyncio.sleep(0.02)
    assert p1.requests_cancelled == 1
    assert not cluster["d1"].completions
    assert gauges and not any(gauges.values())
    assert gauges[f'ppd_node_in_flight{{node="{p1.url}",role="prefill"}}'] == 0


async def test_an_error_response_carries_the_headers_known(
        cluster: dict[str, FakeVLLM]) -> None:
    cluster["p1"].fail_with(500)
    nodes = {"p1": cluster["p1"], "d1": cluster["d1"]}
    async with serve_proxy(config_for(nodes)) as proxy:
        response = await proxy.client.post("/v1/chat/completions",
                                           json=chat_body("x", conversation_id="c-1"))
    assert response.status_code == 502
    assert (response.headers["x-ppd-session"], response.headers["x-ppd-turn"],
            response.headers["x-ppd-route"]) == ("c-1", "1", "pd")


async def test_a_refused_d_is_down_at_once_and_the_turn_served_by_another(
        cluster: dict[str, FakeVLLM]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = replace(config_for({"p1": cluster["p1"], "d2": cluster["d2"]}),
                     nodes=(NodeSpec(cluster["p1"].url, Role.PREFILL), NodeSpec(dead, Role.DECODE),
                            NodeSpec(cluster["d2"].url, Role.DECODE)))
    async with serve_proxy(config) as proxy:
        proxy.state.pool.mark(dead, healthy=True)  # as a stale health view would have it
        # Both Ds idle and never picked: the first listed, the dead one, is tried first.
        response = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
        healthy = {n["url"]: n["healthy"] for n in proxy.state.pool.snapshot()}
    assert response.status_code == 200
    assert response.headers["x-ppd-decode"] == cluster["d2"].url
    assert healthy[dead] is False
    assert len(cluster["p1"].completions) == 2  # P redone for the new D


async def test_a_hanging_p_costs_its_request_the_budget_but_no_strike(
        cluster: dict[str, FakeVLLM]) -> None:
    # --request-timeout bounds the whole request: a P that never answers uses it all (504).
    # The budget ran out, not provably the node (under load a healthy node is slow too), so
    # no strike; the next request goes to the other P (least picked).
    cluster["p1"].faults.hang = True
    config = replace(config_for(cluster, Policy.PD), request_timeout=0.3)
    async with serve_proxy(config) as proxy:
        first = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
        second = await proxy.client.post("/v1/chat/completions", json=chat_body("y"))
        nodes = {n["url"]: n for n in proxy.state.pool.snapshot()}
        stats = (await proxy.client.get("/stats")).json()
    assert first.status_code == 504 and "--request-timeout" in first.json()["error"]["message"]
    assert second.status_code == 200
    assert second.headers["x-ppd-prefill"] == cluster["p2"].url
    assert nodes[cluster["p1"].url]["healthy"] and nodes[cluster["p1"].url]["failures"] == 0
    assert stats["upstream_errors"] == {"prefill:timeout": 1}


# ---- The request timeout bounds the whole request; a runaway stream is cut (issue 23, 5) ----

async def test_the_request_timeout_bounds_a_stream_that_never_ends() -> None:
    async with FakeVLLM("p1") as p1, FakeVLLM("d1", reply="word " * 2000,
                                              chunk_delay_s=0.01) as d1:
        config = config_for({"p1": p1, "d1": d1}, Policy.PD, request_timeout=1.0)
        async with serve_proxy(config) as proxy:
            started = asyncio.get_running_loop().time()
            body = chat_body("talk", stream=True)
            del body["max_tokens"]
            response = await proxy.client.post("/v1/chat/completions", json=body)
            elapsed = asyncio.get_running_loop().time() - started
            nodes = {n["url"]: n for n in proxy.state.pool.snapshot()}
    assert response.status_code == 200
    assert elapsed < 3.0, elapsed  # ~20 s of stream cut at the 1 s budget
    last = response.text.rstrip().rsplit("\n\n", 1)[-1]
    assert "[DONE]" not in response.text
    assert "--request-timeout" in json.loads(last.removeprefix("data: "))["error"]["message"]
    # The budget ran out, not the node: its circuit is not charged.
    assert nodes[d1.url]["failures"] == 0


async def test_the_request_timeout_bounds_legs_that_each_answer_in_time() -> None:
    # P and D each answer within the read timeout, together they do not: a 504 at the budget.
    async with FakeVLLM("p1") as p1, FakeVLLM("d1") as d1:
        p1.faults.delay_s = d1.faults.delay_s = 0.8
        config = config_for({"p1": p1, "d1": d1}, Policy.PD, request_timeout=1.0)
        async with serve_proxy(config) as proxy:
            started = asyncio.get_running_loop().time()
            response = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
            elapsed = asyncio.get_running_loop().time() - started
    assert response.status_code == 504, response.text
    assert "--request-timeout" in response.json()["error"]["message"]
    assert elapsed < 1.5, elapsed


def test_request_timeout_help_says_it_bounds_the_whole_request() -> None:
    from proxy.config.settings import build_parser

    assert "whole request" in " ".join(build_parser().format_help().split())

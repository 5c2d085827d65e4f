"""The request flow against fake vLLM nodes: P leg, D leg, local leg, headers, passthrough."""

from __future__ import annotations

import json
from dataclasses import replace

from proxy.config.policy_config import Policy
from proxy.upstream.pd_protocol import P_KV_TRANSFER_PARAMS
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body, config_for, serve_proxy


async def test_turn1_sends_p_the_p_leg_and_d_the_body_plus_kv_params(
        cluster: dict[str, FakeVLLM]) -> None:
    p1, d1 = cluster["p1"], cluster["d1"]
    nodes = {"p1": p1, "d1": d1}
    body = chat_body("Hi there", stream=True, stream_options={"include_usage": True},
                     min_tokens=2)
    async with serve_proxy(config_for(nodes, Policy.LOCAL)) as proxy:
        response = await proxy.client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["x-ppd-route"] == "pd"
    assert response.headers["x-ppd-turn"] == "1"
    assert response.headers["x-ppd-prefill"] == p1.url
    assert response.headers["x-ppd-decode"] == d1.url
    [p_req], [d_req] = p1.completions, d1.completions
    expected_p = {k: v for k, v in body.items() if k not in ("stream_options", "min_tokens")}
    expected_p.update(max_tokens=1, stream=False, kv_transfer_params=P_KV_TRANSFER_PARAMS)
    assert p_req.body == expected_p
    assert d_req.body == {**body, "kv_transfer_params": p1.kv_params}
    assert p_req.headers["x-request-id"] == d_req.headers["x-request-id"]


async def test_local_turn2_goes_to_same_d_without_p(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.LOCAL)) as proxy:
        first = await proxy.client.post("/v1/chat/completions", json=chat_body("Hello"))
        reply = first.json()["choices"][0]["message"]["content"]
        second_body = chat_body("Hello", reply, "And then?")
        second = await proxy.client.post("/v1/chat/completions", json=second_body)
    assert second.status_code == 200
    assert second.headers["x-ppd-route"] == "local"
    assert second.headers["x-ppd-turn"] == "2"
    assert second.headers["x-ppd-session"] == first.headers["x-ppd-session"]
    assert second.headers["x-ppd-decode"] == first.headers["x-ppd-decode"]
    assert "x-ppd-prefill" not in second.headers
    p_requests = cluster["p1"].completions + cluster["p2"].completions
    assert len(p_requests) == 1  # turn 1 only
    home = cluster["d1"] if cluster["d1"].url == first.headers["x-ppd-decode"] else cluster["d2"]
    assert home.completions[-1].body == second_body  # untouched, no kv_transfer_params


async def test_pd_turn2_goes_p_then_same_d(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster, Policy.PD)) as proxy:
        first = await proxy.client.post("/v1/chat/completions", json=chat_body("Hello"))
        reply = first.json()["choices"][0]["message"]["content"]
        second = await proxy.client.post("/v1/chat/completions",
                                         json=chat_body("Hello", reply, "More"))
    assert second.headers["x-ppd-route"] == "pd"
    assert second.headers["x-ppd-turn"] == "2"
    assert second.headers["x-ppd-decode"] == first.headers["x-ppd-decode"]
    assert second.headers["x-ppd-prefill"] == first.headers["x-ppd-prefill"]
    assert len(cluster["p1"].completions + cluster["p2"].completions) == 2


async def test_streamed_bytes_reach_the_client_unchanged(cluster: dict[str, FakeVLLM]) -> None:
    nodes = {"p1": cluster["p1"], "d1": cluster["d1"]}
    body = chat_body("Stream please", stream=True)
    async with serve_proxy(config_for(nodes)) as proxy:
        via_proxy = await proxy.client.post("/v1/chat/completions", json=body)
    direct_fake = FakeVLLM("d1")
    async with direct_fake:
        import httpx

        async with httpx.AsyncClient() as client:
            direct = await client.post(direct_fake.url + "/v1/chat/completions", json=body)
    assert via_proxy.headers["content-type"].startswith("text/event-stream")
    # Same node name, same reply: the bytes match except the per-second 'created' stamps.
    strip = [json.loads(line[6:]) for line in via_proxy.text.split("\n\n")
             if line.startswith("data: {")]
    strip_direct = [json.loads(line[6:]) for line in direct.text.split("\n\n")
                    if line.startswith("data: {")]
    for event in strip + strip_direct:
        event.pop("created")
    assert strip == strip_direct
    assert via_proxy.text.endswith("data: [DONE]\n\n")


async def test_nodes_get_the_backend_key_not_the_clients(cluster: dict[str, FakeVLLM]) -> None:
    nodes = {"p1": cluster["p1"], "d1": cluster["d1"]}
    config = replace(config_for(nodes, Policy.PD), api_key="client-key",
                     backend_api_key="node-key")
    async with serve_proxy(config) as proxy:
        response = await proxy.client.post("/v1/chat/completions", json=chat_body("Hi"),
                                           headers={"authorization": "Bearer client-key"})
    assert response.status_code == 200
    [p_req], [d_req] = cluster["p1"].completions, cluster["d1"].completions
    assert p_req.headers["authorization"] == d_req.headers["authorization"] == "Bearer node-key"

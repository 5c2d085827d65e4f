"""`proxy.serving.endpoints`: the completion endpoints served ahead of Quart, at the HTTP level."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.behaviour.test_errors import assert_openai_error
from tests.proxy.helpers import chat_body, config_for, serve_proxy


async def test_other_methods_get_an_openai_405_naming_post(cluster: dict[str, FakeVLLM]
                                                           ) -> None:
    async with serve_proxy(config_for(cluster)) as proxy:
        response = await proxy.client.put("/v1/completions", json={})
    assert_openai_error(response, 405)
    assert response.headers["allow"] == "POST"


async def test_bodies_over_the_limit_are_413_declared_or_chunked(
        cluster: dict[str, FakeVLLM]) -> None:
    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 50

    async with serve_proxy(replace(config_for(cluster), max_body_bytes=200)) as proxy:
        declared = await proxy.client.post("/v1/chat/completions",
                                           json=chat_body("y" * 300))
        streamed = await proxy.client.post("/v1/chat/completions", content=chunked())
        small = await proxy.client.post("/v1/chat/completions", json=chat_body("hi"))
    for response in (declared, streamed):
        assert "200-byte limit" in assert_openai_error(response, 413)["message"]
    assert small.status_code == 200
    assert sum(len(node.completions) for node in cluster.values()) == 2  # small's P and D


async def test_a_session_id_outside_latin1_is_not_fatal(cluster: dict[str, FakeVLLM]
                                                               ) -> None:
    async with serve_proxy(config_for(cluster)) as proxy:
        response = await proxy.client.post(
            "/v1/chat/completions", json=chat_body("hi", conversation_id="séance-日本"))
    assert response.status_code == 200
    raw = dict(response.headers.raw)[b"x-ppd-session"]
    assert raw.decode("ascii")  # the router percent-encodes it; the header never fails


async def test_response_headers_of_the_state_reach_completions_and_quart_routes(
        cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster)) as proxy:
        proxy.state.response_headers["x-ppd-worker"] = "3"  # as a worker process sets it
        completion = await proxy.client.post("/v1/chat/completions", json=chat_body("hi"))
        refused = await proxy.client.put("/v1/chat/completions", json={})
        health = await proxy.client.get("/health")
    for response in (completion, refused, health):
        assert response.headers["x-ppd-worker"] == "3"

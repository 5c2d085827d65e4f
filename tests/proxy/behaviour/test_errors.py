"""Every error case answers its status with an OpenAI-shaped body, before any backend is used."""

from __future__ import annotations

import socket
from dataclasses import replace

import httpx
import pytest

from proxy import NodeSpec, Role
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body, config_for, serve_proxy


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, str]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    assert "code" in error and "param" in error  # OpenAI's shape: param is the field, or null
    return error


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(("path", "content", "fragment"), [
    ("/v1/chat/completions", b"{not json", "not valid JSON"),
    ("/v1/chat/completions", b"[1, 2]", "JSON object"),
    ("/v1/chat/completions", b'{"model": "fake-model"}', "messages"),
    ("/v1/chat/completions", b'{"messages": []}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"content": "x"}]}', "role"),
    ("/v1/chat/completions", b'{"messages": ["hi"]}', "role"),
    ("/v1/completions", b'{"model": "fake-model"}', "prompt"),
    ("/v1/completions", b'{"prompt": 5}', "prompt"),
    ("/v1/completions", b'{"prompt": "x", "stream": "yes"}', "stream"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 1.5}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": true}', "max_tokens"),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3}',
     "max_completion_tokens"),
])
async def test_bad_requests_answer_400_without_touching_backends(
        cluster: dict[str, FakeVLLM], path: str, content: bytes, fragment: str) -> None:
    async with serve_proxy(config_for(cluster)) as proxy:
        response = await proxy.client.post(path, content=content,
                                           headers={"content-type": "application/json"})
    error = assert_openai_error(response, 400)
    assert fragment in error["message"]
    if fragment in ("messages", "prompt", "stream", "max_tokens", "max_completion_tokens"):
        assert error["param"] == fragment
    assert not any(node.completions for node in cluster.values())


async def test_body_over_the_limit_answers_413(cluster: dict[str, FakeVLLM]) -> None:
    config = replace(config_for(cluster), max_body_bytes=1000)
    async with serve_proxy(config) as proxy:
        response = await proxy.client.post("/v1/chat/completions",
                                           json=chat_body("x" * 5000))
        small = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
    assert_openai_error(response, 413)
    assert small.status_code == 200


async def test_unknown_model_answers_404(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster)) as proxy:
        response = await proxy.client.post("/v1/chat/completions",
                                           json={**chat_body("x"), "model": "other"})
        models = await proxy.client.get("/v1/models")
    error = assert_openai_error(response, 404)
    assert error["code"] == "model_not_found"
    assert [m["id"] for m in models.json()["data"]] == ["fake-model"]


async def test_no_healthy_decode_answers_503_and_health_says_so(
        cluster: dict[str, FakeVLLM]) -> None:
    cluster["d1"].health_status = 500
    nodes = {"p1": cluster["p1"], "d1": cluster["d1"]}
    async with serve_proxy(config_for(nodes)) as proxy:
        response = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
        health = await proxy.client.get("/health")
    error = assert_openai_error(response, 503)
    assert "decode" in error["message"]
    assert health.status_code == 503
    assert not cluster["p1"].completions


async def test_unreachable_backends_answer_502(cluster: dict[str, FakeVLLM]) -> None:
    # Nodes that refuse connections: the start-up health check marks them down, so make the
    # request bypass that by marking them healthy again, as a stale health view would.
    dead_p, dead_d = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    config = replace(config_for(cluster),
                     nodes=(NodeSpec(dead_p, Role.PREFILL), NodeSpec(dead_d, Role.DECODE)))
    async with serve_proxy(config) as proxy:
        for url in (dead_p, dead_d):
            proxy.state.pool.mark(url, healthy=True)
        response = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
    error = assert_openai_error(response, 502)
    assert dead_p in error["message"]


async def test_prefill_5xx_on_the_only_p_answers_502(cluster: dict[str, FakeVLLM]) -> None:
    cluster["p1"].fail_with(500)
    nodes = {"p1": cluster["p1"], "d1": cluster["d1"]}
    async with serve_proxy(config_for(nodes)) as proxy:
        response = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
        stats = (await proxy.client.get("/stats")).json()
    assert_openai_error(response, 502)
    assert not cluster["d1"].completions
    assert stats["upstream_errors"] == {"prefill:status": 1}


async def test_decode_timeout_answers_504(cluster: dict[str, FakeVLLM]) -> None:
    cluster["d1"].faults.hang = True
    nodes = {"p1": cluster["p1"], "d1": cluster["d1"]}
    config = replace(config_for(nodes), request_timeout=0.3)
    async with serve_proxy(config) as proxy:
        response = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
    error = assert_openai_error(response, 504)
    assert error["type"] == "timeout"


async def test_upstream_4xx_passes_through_unchanged(cluster: dict[str, FakeVLLM]) -> None:
    cluster["d1"].fail_with(400)
    nodes = {"p1": cluster["p1"], "d1": cluster["d1"]}
    async with serve_proxy(config_for(nodes)) as proxy:
        response = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "d1 fails on cue"


async def test_api_key_guards_completions(cluster: dict[str, FakeVLLM]) -> None:
    config = replace(config_for(cluster), api_key="secret")
    async with serve_proxy(config) as proxy:
        missing = await proxy.client.post("/v1/chat/completions", json=chat_body("x"))
        wrong = await proxy.client.post("/v1/chat/completions", json=chat_body("x"),
                                        headers={"authorization": "Bearer nope"})
        right = await proxy.client.post("/v1/chat/completions", json=chat_body("x"),
                                        headers={"authorization": "Bearer secret"})
    assert_openai_error(missing, 401)
    assert_openai_error(wrong, 401)
    assert right.status_code == 200


async def test_unknown_path_and_method_are_openai_shaped(cluster: dict[str, FakeVLLM]) -> None:
    async with serve_proxy(config_for(cluster)) as proxy:
        missing = await proxy.client.get("/v1/nothing")
        wrong_method = await proxy.client.get("/v1/chat/completions")
    assert_openai_error(missing, 404)
    assert_openai_error(wrong_method, 405)


async def test_requests_over_max_in_flight_answer_429(cluster: dict[str, FakeVLLM]) -> None:
    cluster["d1"].chunk_delay_s = 0.05  # the first stream stays open for a while
    cluster["d2"].chunk_delay_s = 0.05
    config = replace(config_for(cluster), max_in_flight=1)
    async with serve_proxy(config) as proxy:
        async with proxy.client.stream("POST", "/v1/chat/completions",
                                       json=chat_body("first", stream=True)) as open_stream:
            assert open_stream.status_code == 200
            refused = await proxy.client.post("/v1/chat/completions", json=chat_body("second"))
            await open_stream.aread()
        # The first request's body is done: its slot is free again.
        after = await proxy.client.post("/v1/chat/completions", json=chat_body("third"))
    error = assert_openai_error(refused, 429)
    assert "limit of 1 open requests" in error["message"]
    assert after.status_code == 200


def test_failure_kinds_are_classes_of_the_one_hierarchy_with_their_metrics_label() -> None:
    from proxy.shared import errors

    failures = {errors.UpstreamRefused: "connect", errors.UpstreamBroken: "transport",
                errors.UpstreamStatus: "status", errors.UpstreamProtocol: "protocol"}
    for failure, label in failures.items():
        exc = failure("boom")
        assert isinstance(exc, errors.UpstreamError) and exc.status == 502
        assert (exc.kind, exc.to_openai_body()["error"]["code"]) == (label, "bad_gateway")
    assert errors.UpstreamTimeout("slow").kind == "timeout"
    assert errors.NoBackend("none").kind == "no_backend"  # no finer label: the code
    assert issubclass(errors.MethodNotAllowed, errors.ProxyError)
    assert errors.MethodNotAllowed.status == 405

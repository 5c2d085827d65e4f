"""Protocol tests of emulated nodes (in-process, linear preset): vLLM's OpenAI API, its P/D
protocol as the proxy drives it, exact usage, vLLM's metric names, and OpenAI-style errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from profiler.emulate.presets import resolve
from profiler.emulate.serve import HostedNode, hosted
from profiler.emulate.tokenizer import Vocabulary
from proxy.shared.vocabulary import Role
from proxy.upstream.pd_protocol import decode_body, prefill_body

MODEL = "llama-3.1-8b"
HISTORY = "Rivers carry silt to the sea and build deltas over many years. " * 40


@pytest.fixture
async def nodes(vocab: Vocabulary) -> AsyncIterator[list[HostedNode]]:
    preset = resolve("linear", MODEL, max_model_len=4096)
    async with hosted(preset, [(Role.PREFILL, 0), (Role.DECODE, 0)], vocab=vocab,
                      report_cached_tokens=True) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as c:
        yield c


async def metrics(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """Samples by name, summed over label sets (buckets left out)."""
    text = (await client.get(f"{url}/metrics")).text
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith(("_bucket", "_created")):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


def chat(content: str = HISTORY, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, **extra}


async def events(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_models_health_and_version(nodes: list[HostedNode],
                                         client: httpx.AsyncClient) -> None:
    url = nodes[0].url
    models = (await client.get(f"{url}/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["owned_by"] == "ppd-emulated:linear:llama-3.1-8b"
    assert (await client.get(f"{url}/health")).status_code == 200
    assert "ppd-emulated" in (await client.get(f"{url}/version")).json()["version"]


async def test_chat_usage_and_text_are_exact(nodes: list[HostedNode], client: httpx.AsyncClient,
                                             vocab: Vocabulary) -> None:
    body = chat(max_tokens=12)
    answer = (await client.post(f"{nodes[1].url}/v1/chat/completions", json=body)).json()
    prompt = len(vocab.encode_chat(body["messages"]))
    assert answer["object"] == "chat.completion"
    assert answer["usage"]["prompt_tokens"] == prompt
    assert answer["usage"]["completion_tokens"] == 12
    assert answer["usage"]["total_tokens"] == prompt + 12
    assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length"
    assert len(vocab.encode_text(choice["message"]["content"])) == 12
    assert answer["kv_transfer_params"] is None


async def test_completions_stream_one_chunk_per_token_then_usage(
    nodes: list[HostedNode], client: httpx.AsyncClient, vocab: Vocabulary
) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    got = await events(client, f"{nodes[1].url}/v1/completions", body)
    assert got[-1] == "[DONE]"
    chunks, usage_event = got[:-2], got[-2]
    assert [c["object"] for c in chunks] == ["text_completion"] * 5
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["length"]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert len(vocab.encode_text(text)) == 5
    assert usage_event["choices"] == []
    assert usage_event["usage"]["prompt_tokens"] == len(vocab.encode_text("Once upon a time"))
    assert usage_event["usage"]["completion_tokens"] == 5


async def test_chat_stream_opens_with_the_role_and_has_no_usage_unless_asked(
    nodes: list[HostedNode], client: httpx.AsyncClient
) -> None:
    got = await events(client, f"{nodes[1].url}/v1/chat/completions",
                       chat(max_tokens=3, stream=True))
    assert got[-1] == "[DONE]"
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("usage" not in e for e in got[:-1])
    assert len(got) == 1 + 3 + 1  # role, three tokens, [DONE]


async def test_prompt_token_ids_are_accepted(nodes: list[HostedNode],
                                             client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "prompt": [5, 6, 7, 8, 9], "max_tokens": 2}
    answer = (await client.post(f"{nodes[1].url}/v1/completions", json=body)).json()
    assert answer["usage"]["prompt_tokens"] == 5


async def test_p_then_d_moves_the_kv_and_d_reports_external_hits(
    nodes: list[HostedNode], client: httpx.AsyncClient, vocab: Vocabulary
) -> None:
    """The proxy's two legs: P answers one token plus kv_transfer_params; D pulls the KV."""
    p, d = nodes
    body = chat(max_tokens=6, stream=True, stream_options={"include_usage": True})
    prompt = len(vocab.encode_chat(body["messages"]))
    before_p, before_d = await metrics(client, p.url), await metrics(client, d.url)
    answer = (await client.post(f"{p.url}/v1/chat/completions", json=prefill_body(body),
                                headers={"X-Request-Id": "turn-1"})).json()
    assert answer["usage"]["completion_tokens"] == 1
    params = answer["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_engine_id"] and params["remote_block_ids"]
    held = await metrics(client, p.url)
    assert held["vllm:kv_cache_usage_perc"] > 0  # P keeps the KV for its D

    got = await events(client, f"{d.url}/v1/chat/completions", decode_body(body, params))
    usage = got[-2]["usage"]
    assert usage == {"prompt_tokens": prompt, "completion_tokens": 6,
                     "total_tokens": prompt + 6, "prompt_tokens_details": {"cached_tokens": prompt}}
    after_d, after_p = await metrics(client, d.url), await metrics(client, p.url)
    external = "vllm:external_prefix_cache_hits_total"
    assert after_d[external] - before_d[external] == prompt
    assert after_d["vllm:prefix_cache_hits_total"] == before_d["vllm:prefix_cache_hits_total"]
    assert after_p["vllm:prefix_cache_queries_total"] - \
        before_p["vllm:prefix_cache_queries_total"] == prompt
    assert after_p["vllm:kv_cache_usage_perc"] == 0  # released once D had it
    assert after_d["vllm:request_success_total"] == before_d["vllm:request_success_total"] + 1


async def test_a_local_turn_hits_the_prefix_d_holds(
    nodes: list[HostedNode], client: httpx.AsyncClient, vocab: Vocabulary
) -> None:
    """Turn 2 on the same D: the turn-1 prompt and reply are cached, block by block."""
    d = nodes[1]
    first = chat(max_tokens=40)
    answer = (await client.post(f"{d.url}/v1/chat/completions", json=first)).json()
    reply = answer["choices"][0]["message"]["content"]
    second = {"model": MODEL, "max_tokens": 4, "messages": [
        *first["messages"], {"role": "assistant", "content": reply},
        {"role": "user", "content": "And what about lakes?"}]}
    answer2 = (await client.post(f"{d.url}/v1/chat/completions", json=second)).json()
    held = answer["usage"]["prompt_tokens"] + 40 - 1  # the last reply token has no KV yet
    block = 16
    assert answer2["usage"]["prompt_tokens"] == len(vocab.encode_chat(second["messages"]))
    assert answer2["usage"]["prompt_tokens_details"]["cached_tokens"] == held // block * block


async def test_cached_tokens_are_not_reported_unless_enabled(
    vocab: Vocabulary, client: httpx.AsyncClient
) -> None:
    async with hosted(resolve("linear", MODEL, max_model_len=4096), [(Role.DECODE, 0)],
                      vocab=vocab) as (d,):
        answer = (await client.post(f"{d.url}/v1/chat/completions", json=chat())).json()
    assert answer["usage"]["prompt_tokens_details"] is None


@pytest.mark.parametrize(("body", "status", "param"), [
    (chat(messages=[]), 400, "messages"),
    (chat(max_tokens=0), 400, "max_tokens"),
    (chat(max_tokens="8"), 400, "max_tokens"),
    (chat(stream="yes"), 400, "stream"),
    (chat(n=2), 400, "n"),
    (chat(model="gpt-4"), 404, "model"),
    (chat(content="word " * 5000), 400, "messages"),
    (chat(max_tokens=4000), 400, "max_tokens"),
    (chat(kv_transfer_params=[1]), 400, "kv_transfer_params"),
    ([1, 2], 400, None),
])
async def test_bad_requests_get_openai_errors(nodes: list[HostedNode], client: httpx.AsyncClient,
                                              body: Any, status: int, param: str | None) -> None:
    response = await client.post(f"{nodes[1].url}/v1/chat/completions", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["code"] == status and error["message"]


async def test_a_bad_prompt_and_bad_json_get_openai_errors(nodes: list[HostedNode],
                                                           client: httpx.AsyncClient) -> None:
    url = f"{nodes[1].url}/v1/completions"
    for content in (b"{not json", json.dumps({"prompt": ""}).encode(),
                    json.dumps({"prompt": [1, "x"]}).encode()):
        response = await client.post(url, content=content,
                                     headers={"content-type": "application/json"})
        assert response.status_code == 400
        assert response.json()["error"]["code"] == 400


async def test_a_client_that_leaves_mid_stream_frees_its_request(
    nodes: list[HostedNode], client: httpx.AsyncClient
) -> None:
    d = nodes[1]
    async with client.stream("POST", f"{d.url}/v1/chat/completions",
                             json=chat(max_tokens=3000, stream=True)) as response:
        lines = response.aiter_lines()
        while not (await anext(lines)).startswith("data: "):
            pass
    for _ in range(200):  # the server notices the closed connection within a few steps
        m = await metrics(client, d.url)
        if m["vllm:num_requests_running"] == 0:
            break
        await asyncio.sleep(0.02)
    assert m["vllm:num_requests_running"] == 0
    assert m["vllm:kv_cache_usage_perc"] == 0


async def test_metrics_carry_vllms_names(nodes: list[HostedNode],
                                         client: httpx.AsyncClient) -> None:
    await client.post(f"{nodes[1].url}/v1/chat/completions", json=chat(max_tokens=3))
    m = await metrics(client, nodes[1].url)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_hits_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_count",
                 "vllm:inter_token_latency_seconds_count", "vllm:request_success_total"):
        assert name in m, name
    assert m["vllm:time_to_first_token_seconds_count"] == 1
    assert m["vllm:inter_token_latency_seconds_count"] == 2
    assert m["vllm:generation_tokens_total"] == 3


async def test_a_broken_engine_answers_500_not_a_hang(nodes: list[HostedNode],
                                                      client: httpx.AsyncClient) -> None:
    d = nodes[1]

    def explode(now: float) -> Any:
        raise RuntimeError("engine bug")

    d.service.node.engine.step = explode  # type: ignore[method-assign]
    for _ in range(2):  # the request that meets the failure, then one after it
        response = await client.post(f"{d.url}/v1/chat/completions", json=chat())
        assert response.status_code == 500
        assert "engine bug" in response.json()["error"]["message"]


async def test_a_replica_node_serves_whole_requests_and_rejects_a_kv_pull_to_a_p(
    vocab: Vocabulary, client: httpx.AsyncClient
) -> None:
    preset = resolve("linear", MODEL, max_model_len=4096)
    async with hosted(preset, [(Role.REPLICA, 0), (Role.PREFILL, 0)], vocab=vocab) as (r, p):
        answer = (await client.post(f"{r.url}/v1/chat/completions", json=chat())).json()
        assert answer["usage"]["completion_tokens"] == 8
        # A P node never receives KV (vLLM's producer role): a D leg sent to it is refused.
        params = {"do_remote_prefill": True, "remote_engine_id": "elsewhere"}
        refused = await client.post(f"{p.url}/v1/chat/completions",
                                    json=chat(kv_transfer_params=params))
    assert refused.status_code == 400
    assert "does not receive KV" in refused.json()["error"]["message"]


async def test_reset_prefix_cache_empties_the_cache_as_vllms_dev_route_does(
    nodes: list[HostedNode], client: httpx.AsyncClient
) -> None:
    d = nodes[1]
    await client.post(f"{d.url}/v1/chat/completions", json=chat(max_tokens=4))
    warm = (await client.post(f"{d.url}/v1/chat/completions", json=chat(max_tokens=4))).json()
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    reset = await client.post(f"{d.url}/reset_prefix_cache")
    assert reset.status_code == 200 and reset.json() == {"success": True}
    cold = (await client.post(f"{d.url}/v1/chat/completions", json=chat(max_tokens=4))).json()
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

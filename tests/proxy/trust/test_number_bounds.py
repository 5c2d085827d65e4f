"""Issue #45, failure 11: numbers from a node are finite and in range, else a 502 for that
request only; no running statistic becomes inf or NaN (10^308 completion tokens once made
every later request without max_tokens a 500 until restart)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from proxy import NodeSpec, PolicyConfig, ProxyConfig, Role, create_app, running
from proxy.config.policy_config import Policy
from proxy.live.load_meter import RunningMean
from proxy.shared.tokens import MAX_TOKEN_COUNT


def answer(usage: str, stream: bool) -> str:
    if stream:
        first = {"id": "x", "object": "chat.completion.chunk", "model": "m",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"},
                              "finish_reason": None}]}
        last = ('{"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": '
                '[{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": ' + usage + "}")
        return f"data: {json.dumps(first)}\n\ndata: {last}\n\ndata: [DONE]\n\n"
    return ('{"id": "x", "object": "chat.completion", "model": "m", "choices": [{"index": 0, '
            '"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}], '
            '"usage": ' + usage + "}")


POISON = [
    '{"prompt_tokens": 5, "completion_tokens": 1' + "0" * 308 + ', "total_tokens": 5}',
    '{"prompt_tokens": 5, "completion_tokens": 1e309, "total_tokens": 5}',
    '{"prompt_tokens": NaN, "completion_tokens": NaN, "total_tokens": 5}',
    '{"prompt_tokens": 5, "completion_tokens": 9223372036854775807, "total_tokens": 5}',
    '{"prompt_tokens": 5, "completion_tokens": -3, "total_tokens": 5}',
]
HONEST = '{"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}'


def poisoned_node(usage: str) -> httpx.MockTransport:
    served = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("completions"):
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        sent = json.loads(request.content)
        stream = bool(sent.get("stream"))
        if (sent.get("kv_transfer_params") or {}).get("do_remote_decode"):  # a P leg
            return httpx.Response(200, text=answer(HONEST, False)[:-1] + ', "kv_transfer_params"'
                                  ': {"remote_engine_id": "e", "remote_block_ids": [1]}}')
        served["n"] += 1
        text = answer(usage if served["n"] <= 2 else HONEST, stream)
        return httpx.Response(200, text=text, headers={
            "content-type": "text/event-stream" if stream else "application/json"})

    return httpx.MockTransport(handler)


@pytest.mark.parametrize("usage", POISON)
async def test_poisoned_usage_is_a_502_for_that_request_and_later_ones_are_served(
        usage: str) -> None:
    config = ProxyConfig(nodes=(NodeSpec("http://p:1", Role.PREFILL),
                                NodeSpec("http://d:1", Role.DECODE)),
                         policy=PolicyConfig(Policy.LOCAL), port=0, health_interval=60)
    app = create_app(config, transport=poisoned_node(usage))
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "x"}]}
    async with running(app) as server, httpx.AsyncClient(base_url=server.url) as client:
        whole = await client.post("/v1/chat/completions", json=body)
        # A stream has answered 200 before its usage arrives: the usage is ignored instead.
        streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
        later = await client.post("/v1/chat/completions", json=body)  # no max_tokens
        mean = app.extensions["ppd"].router.expected_output.value
    assert whole.status_code == 502 and "usage." in whole.json()["error"]["message"]
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    assert later.status_code == 200
    assert 0 <= mean <= MAX_TOKEN_COUNT


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -float("inf")])
def test_a_running_mean_ignores_what_is_not_finite(value: float) -> None:
    mean = RunningMean(100.0)
    mean.add(10.0)
    mean.add(value)
    assert mean.value == 10.0

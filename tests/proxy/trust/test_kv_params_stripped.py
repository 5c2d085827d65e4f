"""Issue #45, failure 14: D's kv_transfer_params (its NIXL host, port and block ids) never
reach the client - with `return_token_ids` asked by the client, and without
--kv-readback-ttl."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from proxy import NodeSpec, PolicyConfig, ProxyConfig, Role, create_app, running
from proxy.config.policy_config import Policy
from proxy.readback.protocol import without_kv_params

D_PARAMS = {"remote_host": "10.9.9.9", "remote_port": 5601, "remote_block_ids": [7, 8, 9],
            "remote_engine_id": "d-engine", "do_remote_prefill": True}
SECRETS = ("10.9.9.9", "5601", "d-engine", "remote_block_ids")


def node(request: httpx.Request) -> httpx.Response:
    if not request.url.path.endswith("completions"):
        return httpx.Response(200, json={"data": [{"id": "m"}]})
    sent = json.loads(request.content)
    is_prefill = (sent.get("kv_transfer_params") or {}).get("do_remote_decode")
    params = ({"remote_engine_id": "p-engine", "remote_block_ids": [1], "remote_host": "p",
               "remote_port": 1} if is_prefill else D_PARAMS)
    answer = {"id": "x", "object": "chat.completion", "model": "m",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                           "finish_reason": "stop", "token_ids": [5, 6]}],
              "prompt_token_ids": [1, 2],
              "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
              "kv_transfer_params": params}
    return httpx.Response(200, json=answer)


@pytest.mark.parametrize("policy", [Policy.PD, Policy.LOCAL])
@pytest.mark.parametrize("extra", [{}, {"return_token_ids": True}])
async def test_no_answer_carries_ds_kv_transfer_params(policy: Policy,
                                                       extra: dict[str, Any]) -> None:
    config = ProxyConfig(nodes=(NodeSpec("http://p:1", Role.PREFILL),
                                NodeSpec("http://d:1", Role.DECODE)),
                         policy=PolicyConfig(policy), port=0, health_interval=60)
    app = create_app(config, transport=httpx.MockTransport(node))
    body = {"messages": [{"role": "user", "content": "x"}], **extra}
    async with running(app) as server, httpx.AsyncClient(base_url=server.url) as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    seen = response.text + json.dumps(dict(response.headers))
    assert not any(secret in seen for secret in SECRETS), seen
    if extra:  # what the client asked for itself stays
        assert response.json()["choices"][0]["token_ids"] == [5, 6]


def test_without_kv_params_leaves_vllms_null_and_other_bodies_untouched() -> None:
    for body in (b'{"kv_transfer_params": null, "a": 1}', b'{"a": 1}', b"not json",
                 b'["kv_transfer_params"]'):
        assert without_kv_params(body) is body
    assert json.loads(without_kv_params(b'{"kv_transfer_params": {"x": 1}, "a": 1}')) == {
        "a": 1}


def test_a_null_elsewhere_does_not_hide_ds_params() -> None:
    body = b'{"a": {"kv_transfer_params":null}, "kv_transfer_params": {"remote_host": "h"}}'
    assert b"remote_host" not in without_kv_params(body)

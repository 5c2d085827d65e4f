"""Issue #45 (noted): a client's `session_id` body field never reaches P or D, under every
policy (it was replaced only under `live`; vLLM tags its KV events with it)."""

from __future__ import annotations

import pytest

from proxy.config.policy_config import Policy
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body, config_for, serve_proxy


@pytest.mark.parametrize("policy", [Policy.LOCAL, Policy.PD])
async def test_a_clients_session_id_is_replaced_by_the_proxys(
        cluster: dict[str, FakeVLLM], policy: Policy) -> None:
    async with serve_proxy(config_for(cluster, policy)) as proxy:
        response = await proxy.client.post(
            "/v1/chat/completions", json=chat_body("hi", session_id="someone-elses-session"))
    assert response.status_code == 200
    sent = [r.body.get("session_id") for node in cluster.values() for r in node.completions]
    assert sent and "someone-elses-session" not in sent
    assert all(isinstance(s, str) and s for s in sent)

"""A client that sends its next turn the moment it reads `[DONE]` must find the session
updated, even when the upstream stream closes later (seen under load with real vLLM)."""

from __future__ import annotations

import json

import httpx

from proxy.config.policy_config import Policy
from tests.fakes.fake_vllm import FakeVLLM
from tests.proxy.helpers import chat_body, config_for, serve_proxy


async def _stream_until_done(client: httpx.AsyncClient,
                             body: dict) -> tuple[dict[str, str], str]:
    """Read SSE events until `[DONE]`, then return without waiting for the body to end."""
    parts = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                return dict(response.headers), "".join(parts)
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    parts.append(choice.get("delta", {}).get("content") or "")
    raise AssertionError("the stream ended without [DONE]")


async def test_next_turn_right_after_done_continues_the_session(
        cluster: dict[str, FakeVLLM]) -> None:
    nodes = {"p1": cluster["p1"], "d1": cluster["d1"]}
    cluster["d1"].faults.linger_after_done_s = 1.0
    async with serve_proxy(config_for(nodes, Policy.LOCAL)) as proxy:
        first = chat_body("Tell me a story.", stream=True)
        headers, reply = await _stream_until_done(proxy.client, first)
        assert headers["x-ppd-turn"] == "1"
        second = chat_body("Tell me a story.", reply, "Go on.", stream=True)
        headers, _ = await _stream_until_done(proxy.client, second)
    assert (headers["x-ppd-turn"], headers["x-ppd-route"]) == ("2", "local")

"""A client that sends its next turn the moment it reads `[DONE]` must find the session
updated, even when the upstream stream closes later (seen under load with real vLLM)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from proxy.config.policy_config import Policy
from tests.fakes.fake_vllm import FakeVLLM
from tests.fakes.scripted_node import Answer, scripted_node
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


def _ending_with_done(path: str, body: dict[str, Any]) -> Answer:
    """A D whose stream's first event goes out alone and its last events, `[DONE]` and the
    body's end in one write (as vLLM's last writes reach a proxy under load): the relay may
    then record the turn after the client has its end (`Relay.record_late`)."""
    events = [b'data: {"choices": [{"index": 0, "delta": {"content": "%s"}}]}\n\n' % word
              for word in (b"Once", b" upon", b" a time.")]
    events.append(b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n')
    return Answer((events[0], *events[1:], b"data: [DONE]\n\n"), "text/event-stream",
                  pause_s=0.01)


async def test_turns_sent_the_moment_each_done_arrives_all_continue_the_session(
        cluster: dict[str, FakeVLLM]) -> None:
    async with scripted_node(_ending_with_done) as decode:
        nodes = {"p1": cluster["p1"], "d1": decode}
        async with serve_proxy(config_for(nodes, Policy.LOCAL)) as proxy:  # type: ignore[arg-type]
            contents = ["Tell me a story."]
            for turn in range(1, 7):
                headers, reply = await _stream_until_done(proxy.client,
                                                          chat_body(*contents, stream=True))
                assert reply == "Once upon a time."
                assert headers["x-ppd-turn"] == str(turn)
                assert headers["x-ppd-route"] == ("pd" if turn == 1 else "local")
                contents += [reply, f"Go on ({turn})."]
            assert proxy.state.sessions.live() == 1

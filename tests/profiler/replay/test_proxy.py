"""Replay through the real ppd proxy (fake vLLM nodes behind it): routes match the policy and the
proxy follows each conversation as one session, for both APIs."""

from __future__ import annotations

import pytest

from profiler.replay import ReplayConfig, replay
from profiler.replay.metrics import summarize
from profiler.traces import Conversation, Turn
from proxy import ProxyConfig, create_app
from proxy.config.cluster_file import NodeSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.serving.server import running
from proxy.shared.vocabulary import Role
from tests.fakes.fake_vllm import FakeVLLM


def _conversations(count: int, turns: int) -> list[Conversation]:
    return [
        Conversation(id=f"conv{i}", turns=tuple(
            Turn(f"conversation {i} asks question {k}", "reference", 8)
            for k in range(1, turns + 1)))
        for i in range(count)
    ]


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("policy, later_route", [(Policy.LOCAL, "local"), (Policy.PD, "pd")])
async def test_routes_follow_the_policy(api: str, policy: Policy, later_route: str) -> None:
    async with FakeVLLM("p") as p, FakeVLLM("d") as d:
        config = ProxyConfig(nodes=(NodeSpec(p.url, Role.PREFILL), NodeSpec(d.url, Role.DECODE)),
                             policy=PolicyConfig(kind=policy), port=0)
        async with running(create_app(config)) as proxy:
            result = await replay(_conversations(3, turns=3), ReplayConfig(
                target=proxy.url, qps=30.0, duration_s=0.2, max_conversations=3, api=api,
                timeout_s=10.0))
    records = result.records
    assert len(records) == 9 and all(r.success for r in records), [r.error for r in records]
    for record in records:
        assert record.proxy_turn == record.turn  # the proxy saw one session per conversation
        assert record.route == ("pd" if record.turn == 1 else later_route)
        assert record.decode == d.url
        assert record.prefill == (p.url if record.route == "pd" else None)
    summary = summarize(records, result.wall_time_s)
    assert summary["local_share"] == (1.0 if later_route == "local" else 0.0)
    # P saw only the prefill legs: turn 1 always, turn 2+ only under the pd policy
    assert len(p.completions) == (3 if later_route == "local" else 9)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_a_reasoning_model_conversation_continues_its_session(field: str) -> None:
    # The replay and the proxy read the reply with one parser and one history rule: the
    # reasoning is not sent back, so turn 2's history is what the proxy fingerprinted.
    async with FakeVLLM("p") as p, FakeVLLM("d", reasoning="First I think hard.",
                                            reasoning_field=field) as d:
        config = ProxyConfig(nodes=(NodeSpec(p.url, Role.PREFILL), NodeSpec(d.url, Role.DECODE)),
                             policy=PolicyConfig(kind=Policy.LOCAL), port=0)
        async with running(create_app(config)) as proxy:
            result = await replay(_conversations(1, turns=3), ReplayConfig(
                target=proxy.url, qps=30.0, duration_s=0.2, max_conversations=1,
                timeout_s=10.0))
    records = result.records
    assert [r.success for r in records] == [True, True, True], [r.error for r in records]
    assert [(r.proxy_turn, r.route) for r in records] == [(1, "pd"), (2, "local"), (3, "local")]
    replied = d.completions[-1].body["messages"][1]
    # the thinking stayed out (max_tokens 8 bounds both: 4 words of thinking, 4 of reply)
    assert replied == {"role": "assistant", "content": " ".join(d.reply.split()[:4])}

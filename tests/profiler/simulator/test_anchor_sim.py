"""The anchor policies (docs/anchor-policies.md) in the simulator, on 2P2D: every turn of
four three-turn conversations succeeds, the nodes each rule names are the ones the turns
ran on, and where a rule pins a session (vllm-router's hash) its turns stay together."""

from __future__ import annotations

import pytest

from profiler.engine import LinearCost
from profiler.engine.transfer import load_link, load_model_shape
from profiler.simulator.virtual_cluster import SimSetup, Simulator
from profiler.simulator.workload import Arrival, SimConversation, SimTurn
from proxy.config.policy_config import PolicyConfig
from proxy.policies.routing import RoutingPolicy
from proxy.shared.vocabulary import Layout

ANCHORS = ("llm-d", "llm-d-sticky", "dynamo", "vllm-router", "vllm-example")


def _records(policy: str, cost: LinearCost):  # type: ignore[no-untyped-def]
    setup = SimSetup(Layout.parse("2P2D"), cost, RoutingPolicy(PolicyConfig(kind=policy)),
                     load_link("nvlink"), load_model_shape("llama-3.1-8b").kv_bytes_per_token)
    arrivals = [Arrival(0.05 * i, SimConversation(
        f"c{i}", (SimTurn(3000, 20), SimTurn(8, 20), SimTurn(600, 20)))) for i in range(4)]
    return Simulator(setup).run(arrivals).records


@pytest.mark.parametrize("policy", ANCHORS)
def test_an_anchor_serves_every_turn_in_the_simulator(policy: str,
                                                      hand_cost: LinearCost) -> None:
    records = _records(policy, hand_cost)
    assert len(records) == 12 and all(r.success for r in records)
    assert {r.route for r in records if r.turn == 1} == {"pd"}
    assert len({r.decode for r in records}) == 2 and len({r.prefill for r in records} - {None}) <= 2


def test_vllm_router_keeps_each_conversation_on_one_d_and_skips_p_for_8_tokens(
        hand_cost: LinearCost) -> None:
    records = _records("vllm-router", hand_cost)
    for conversation in {r.conversation_id for r in records}:
        assert len({r.decode for r in records if r.conversation_id == conversation}) == 1
    assert {r.route for r in records if r.turn == 2} == {"local"}  # 8 new tokens <= 256
    assert {r.route for r in records if r.turn == 3} == {"pd"}  # 600 > 256


def test_vllm_example_alternates_its_ds(hand_cost: LinearCost) -> None:
    records = sorted(_records("vllm-example", hand_cost), key=lambda r: r.start_s)
    decodes = [r.decode for r in records]
    assert all(a != b for a, b in zip(decodes, decodes[1:], strict=False))

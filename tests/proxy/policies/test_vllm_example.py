"""vLLM's multi-turn example proxy (`proxy.policies.vllm_example`): P and D by two round robins
kept in the policy's memory, every later turn read back from the session's D."""

from __future__ import annotations

from proxy.config.policy_config import PolicyConfig
from proxy.policies.base import Inputs
from proxy.policies.routing import RoutingPolicy
from proxy.policies.vllm_example import NAME, Cycles, decide, remember
from proxy.shared.vocabulary import Decision, Reason, RouteKind, Workload
from tests.proxy.policies.views import D0, D1, P0, P1, node, turn, view

INPUTS = Inputs(PolicyConfig(kind=NAME))


def test_both_round_robins_advance_once_per_request() -> None:
    cycles = remember(None)
    seen = []
    for number in (1, 2, 1, 2):
        decision, cycles = decide(turn(100 * (number > 1), 50, number=number), INPUTS, cycles)
        seen.append((decision.prefill, decision.decode))
    assert seen == [(P0, D0), (P1, D1), (P0, D0), (P1, D1)]
    assert cycles == Cycles(4, 4)


def test_decide_is_pure_given_its_memory() -> None:
    once = decide(turn(100, 50), INPUTS, Cycles(3, 5))
    assert once == decide(turn(100, 50), INPUTS, Cycles(3, 5))
    assert once[0] == Decision(RouteKind.READBACK, Reason.POLICY, decode=D1, prefill=P1)


def test_turn_one_and_a_turn_without_its_d_are_plain_p_to_d() -> None:
    assert decide(turn(0, 50, number=1), INPUTS, Cycles())[0].kind is RouteKind.PD
    decision = decide(turn(100, 50, can_local=False), INPUTS, Cycles())[0]
    assert (decision.kind, decision.reason) == (RouteKind.PD, Reason.NO_HOME)


def test_the_cycle_skips_a_node_that_is_down() -> None:
    cluster = view(node(P0), node(D1))  # P1 and D0 not usable
    decision, _ = decide(turn(100, 50, cluster), INPUTS, Cycles(1, 0))
    assert (decision.prefill, decision.decode) == (P0, D1)


def test_the_routing_policy_keeps_the_cycles_between_turns() -> None:
    policy = RoutingPolicy(PolicyConfig(kind=NAME))
    cluster = view()
    decodes = [policy.decide(Workload(1, 50, 0, 64, 1.0), f"s{i}", False, view=cluster).decode
               for i in range(3)]
    assert decodes == [D0, D1, D0]

"""Policy live picks its nodes (`proxy.policies.live` with `proxy.live.nodes`): P->D to the D
its model prices best - another than the session's when that one lost the history or has no
room - and local only on a session's D with room for the prompt."""

from __future__ import annotations

from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.cluster_view import ClusterView, NodeView
from proxy.live.predict import NodeState, StepCosts, TurnState
from proxy.policies.routing import RoutingPolicy
from proxy.shared.vocabulary import Reason, Role, RouteKind, Workload

COSTS = StepCosts(base_ms=6.0, per_prefill_token_ms=0.02, per_decode_seq_ms=0.01,
                  per_decode_kv_ktoken_ms=0.01, transfer_ms_per_ktoken=0.3)
D0, D1, P0 = "http://d0", "http://d1", "http://p0"


def _d(url: str, running: float, usage: float, held: int | None) -> NodeView:
    return NodeView(url, Role.DECODE, running=running, waiting=0.0, kv_usage=usage,
                    kv_blocks=2000, kv_block_size=16, held_tokens=held)


def _decide(workload: Workload, d0: NodeView, d1: NodeView, can_local: bool = True):
    view = ClusterView((NodeView(P0, Role.PREFILL, running=0.0, waiting=0.0), d0, d1), P0, D0)
    home = NodeState(d0.busy, 0.0, d0.held_tokens, 16, None,
                     round((1 - (d0.kv_usage or 0.0)) * 32_000))
    state = TurnState(home, NodeState(0.0, 0.0, 0, 16))
    policy = RoutingPolicy(PolicyConfig(kind=Policy.LIVE), costs=COSTS)
    return policy.decide(workload, "s", can_local, state, view=view)


def test_a_short_turn_on_a_d_that_holds_its_history_runs_locally() -> None:
    decision = _decide(Workload(2, 32, 4000, 256, 1.0), _d(D0, 8.0, 0.3, 4000),
                       _d(D1, 8.0, 0.3, 0))
    assert decision.kind is RouteKind.LOCAL


def test_a_history_evicted_from_a_busy_d_goes_p_to_d_on_the_light_one() -> None:
    decision = _decide(Workload(2, 512, 8000, 256, 1.0), _d(D0, 150.0, 0.5, 0),
                       _d(D1, 2.0, 0.1, 0))
    assert (decision.kind, decision.reason, decision.decode) == (RouteKind.PD,
                                                                  Reason.EVICTED, D1)
    assert decision.prefill == P0


def test_no_room_on_the_sessions_d_rules_local_out() -> None:
    # D0 holds the whole history but has 1,600 tokens free; D1 has room
    decision = _decide(Workload(2, 32, 4000, 256, 1.0), _d(D0, 8.0, 0.95, 4000),
                       _d(D1, 8.0, 0.3, 0))
    assert decision.kind is RouteKind.PD and decision.decode == D1


def test_turn_one_is_placed_on_the_lighter_d() -> None:
    decision = _decide(Workload(1, 4000, 0, 256, 1.0), _d(D0, 150.0, 0.5, None),
                       _d(D1, 2.0, 0.1, None), can_local=False)
    assert (decision.kind, decision.reason, decision.decode) == (RouteKind.PD,
                                                                  Reason.TURN1, D1)


def _first_turn(p_running: float, p_waiting: float):
    view = ClusterView((NodeView(P0, Role.PREFILL, running=p_running, waiting=p_waiting),
                        _d(D0, 40.0, 0.4, None), _d(D1, 1.0, 0.05, None)))
    policy = RoutingPolicy(PolicyConfig(kind=Policy.LIVE), costs=COSTS)
    return policy.decide(Workload(1, 4000, 0, 256, 2.0), "s", False, None, view=view)


def test_a_first_turn_is_served_whole_on_the_light_d_while_p_is_backed_up() -> None:
    decision = _first_turn(2.0, 12.0)
    assert (decision.kind, decision.reason, decision.decode) == (RouteKind.LOCAL,
                                                                 Reason.TURN1, D1)


def test_a_first_turn_goes_p_to_d_while_p_keeps_up() -> None:
    decision = _first_turn(0.0, 0.0)
    assert (decision.kind, decision.reason, decision.prefill) == (RouteKind.PD, Reason.TURN1, P0)

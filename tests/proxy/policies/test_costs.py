"""What live and ppd say they weighed (`Decision.costs`, shown as x-ppd-costs): live's own
predictions of each route's TTFT, ppd's table row for the turn's cell."""

from __future__ import annotations

from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.predict import NodeState, StepCosts, TurnState, predict
from proxy.policies.routing import RoutingPolicy
from proxy.policies.table import DecisionTable
from proxy.shared.discretize import classify
from proxy.shared.vocabulary import RouteCost, RouteKind, Workload

COSTS = StepCosts(base_ms=6.0, per_prefill_token_ms=0.02, per_decode_seq_ms=0.01,
                  per_decode_kv_ktoken_ms=0.01, transfer_ms_per_ktoken=0.3)


def test_live_says_the_ttft_it_predicted_for_each_route() -> None:
    policy = RoutingPolicy(PolicyConfig(kind=Policy.LIVE), costs=COSTS)
    # D holds the whole history: a 32-token append-prefill beats re-sending 4,000 tokens.
    resident = Workload(2, 32, 4000, 256, 1.0)
    # A busy D that lost the history: P->D (re-prefilling it there delays its whole batch).
    evicted = Workload(2, 512, 8000, 256, 1.0)
    for workload, running, held, kind in ((resident, 8.0, 4000, RouteKind.LOCAL),
                                          (evicted, 150.0, 0, RouteKind.PD)):
        state = TurnState(NodeState(running=running, held_tokens=held, block_size=16),
                          NodeState(block_size=16))
        decision = policy.decide(workload, "s", True, state)
        predicted = predict(workload, state, COSTS)
        assert decision.kind is kind
        assert decision.costs == (RouteCost(RouteKind.PD, predicted.ttft_pd_ms),
                                  RouteCost(RouteKind.LOCAL, predicted.ttft_local_ms))
        if held:
            assert predicted.ttft_local_ms < predicted.ttft_pd_ms / 2


def test_ppd_says_what_its_table_measured_for_the_cell() -> None:
    row = {"context_class": "small", "workload": "small_bal", "qps": 1.0, "pd_ttft_ms": 210.0,
           "pd_tpot_ms": 40.0, "pd_success": 1.0, "local_ttft_ms": 90.0,
           "local_tpot_ms": 44.0, "local_success": 1.0, "n_requests": 10}
    table = DecisionTable.from_rows([row])
    workload = Workload(2, 64, 200, 64, 1.0)
    assert classify(200, 64, 64, 1.0, table.qps_points).workload == "small_bal"
    policy = RoutingPolicy(PolicyConfig(kind=Policy.PPD, table=__file__), table=table)
    decision = policy.decide(workload, "s", True, None)
    assert decision.kind is RouteKind.LOCAL
    assert decision.costs == (RouteCost(RouteKind.PD, 210.0, 40.0),
                              RouteCost(RouteKind.LOCAL, 90.0, 44.0))

"""Policy live: both routes predicted from residency, load and a step-cost model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.config import ConfigError, NodeSpec, Policy, PolicyConfig, ProxyConfig
from proxy.live import NodeState, StepCosts, TurnState, predict
from proxy.policies import Reason, RoutingPolicy
from proxy.route import Role, RouteKind, Workload

# Round numbers: a step is 6 ms + 0.02 ms per prompt token + 0.01 ms per decoding request.
COSTS = StepCosts(base_ms=6.0, per_prefill_token_ms=0.02, per_decode_seq_ms=0.01,
                  transfer_ms_per_ktoken=0.3)
LIVE = PolicyConfig(kind=Policy.LIVE)


def turn(n_ctx: int = 2048, n_in: int = 64, n_out: int = 256) -> Workload:
    return Workload(2, n_in, n_ctx, n_out, 4.0)


def state(held: int | None, running: float = 32.0, p_held: int | None = None) -> TurnState:
    return TurnState(NodeState(running, 0.0, held, 16), NodeState(0.0, 0.0, p_held, 16))


def test_predict_charges_local_for_what_d_no_longer_holds() -> None:
    resident = predict(turn(), state(2048 - 16), COSTS)  # the partial last block only
    evicted = predict(turn(), state(0), COSTS)
    assert resident.missing_tokens == 0 and evicted.missing_tokens == 2048
    # Local prefills 64 tokens when D holds the history, 2,112 when it holds none.
    assert evicted.ttft_local_ms - resident.ttft_local_ms == pytest.approx(2048 * 0.02)
    assert evicted.ttft_pd_ms == resident.ttft_pd_ms  # P->D does not depend on D's cache
    assert evicted.batch_delay_ms == pytest.approx(32 * 2112 * 0.02)


def test_p_that_holds_the_history_makes_p_to_d_cheaper() -> None:
    cold, warm = predict(turn(), state(2048), COSTS), predict(turn(), state(2048, p_held=2000),
                                                              COSTS)
    assert cold.ttft_pd_ms - warm.ttft_pd_ms == pytest.approx(2000 * 0.02)


def test_resident_session_stays_local_and_evicted_one_goes_p_to_d() -> None:
    policy = RoutingPolicy(LIVE, costs=COSTS)
    assert policy.decide(turn(), "s", True, state(2048)) == \
        policy.decide(turn(), "s", True, state(2048))
    decision = policy.decide(turn(), "s", True, state(2048))
    assert decision.kind is RouteKind.LOCAL and decision.reason is Reason.LIVE
    evicted = policy.decide(turn(), "s", True, state(0, running=128))
    assert evicted.kind is RouteKind.PD and evicted.reason is Reason.EVICTED


def test_unknown_residency_behaves_as_fully_held() -> None:
    policy = RoutingPolicy(LIVE, costs=COSTS)
    assert policy.decide(turn(), "s", True, state(None)).kind is RouteKind.LOCAL
    assert policy.decide(turn(), "s", True).kind is RouteKind.LOCAL  # no state at all


def test_turn_one_and_no_home_go_p_to_d() -> None:
    policy = RoutingPolicy(LIVE, costs=COSTS)
    assert policy.decide(Workload(1, 100, 0, 10, 1.0), "s", False).reason is Reason.TURN1
    assert policy.decide(turn(), "s", False, state(2048)).reason is Reason.NO_HOME


def test_w_tpot_moves_a_big_paste_on_a_busy_d_to_p_to_d() -> None:
    paste = turn(n_ctx=512, n_in=1024, n_out=512)
    busy = state(512, running=60)
    balanced = RoutingPolicy(LIVE, costs=COSTS)
    heavy = RoutingPolicy(PolicyConfig(kind=Policy.LIVE, w_tpot=6.0), costs=COSTS)
    assert balanced.decide(paste, "s", True, busy).kind is RouteKind.LOCAL
    decision = heavy.decide(paste, "s", True, busy)
    assert decision.kind is RouteKind.PD and decision.reason is Reason.LIVE


def test_live_needs_costs() -> None:
    with pytest.raises(ValueError, match="step-cost"):
        RoutingPolicy(LIVE)
    nodes = (NodeSpec("http://p", Role.PREFILL), NodeSpec("http://d", Role.DECODE))
    with pytest.raises(ConfigError, match="--live-costs"):
        ProxyConfig(nodes=nodes, policy=LIVE)


def test_cost_file_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"name": "x", "base_ms": 1, "per_prefill_token_ms": 0.1,
                                "per_decode_seq_ms": 0.5}))
    assert StepCosts.load(path).step_ms(10, 0, 2, 0) == pytest.approx(1 + 1 + 1)
    with pytest.raises(ValueError, match="cannot read"):
        StepCosts.load(tmp_path / "missing.json")
    path.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        StepCosts.load(path)
    path.write_text(json.dumps({"base_ms": 1}))
    with pytest.raises(ValueError, match="lacks 'per_prefill_token_ms'"):
        StepCosts.load(path)
    path.write_text(json.dumps({"base_ms": -1, "per_prefill_token_ms": 0,
                                "per_decode_seq_ms": 0}))
    with pytest.raises(ValueError, match="base_ms must be"):
        StepCosts.load(path)

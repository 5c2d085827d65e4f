"""Hybrid layouts in the simulator: policy live places conversations on R or P->D."""

from __future__ import annotations

import pytest

from profiler.engine import LinearCost
from profiler.engine.transfer import load_link, load_model_shape
from profiler.simulator.grid import HYBRID_LAYOUTS, expand_layouts, grid_cells
from profiler.simulator.run import RunSpec
from profiler.simulator.virtual_cluster import SimSetup, Simulator
from profiler.simulator.workload import Arrival, SimConversation, SimTurn
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.predict import StepCosts
from proxy.policies.routing import RoutingPolicy
from proxy.shared.vocabulary import Decision, Layout, LayoutError

NVLINK = load_link("nvlink")
LLAMA_KV = load_model_shape("llama-3.1-8b").kv_bytes_per_token


def test_live_places_conversations_on_the_replica_and_p_to_d_and_keeps_them_there(
        hand_cost: LinearCost, monkeypatch: pytest.MonkeyPatch) -> None:
    decisions: list[tuple[int, Decision]] = []
    decide = RoutingPolicy.decide

    def spy(self, workload, *args, **kwargs):  # type: ignore[no-untyped-def]
        decision = decide(self, workload, *args, **kwargs)
        decisions.append((workload.turn, decision))
        return decision

    monkeypatch.setattr(RoutingPolicy, "decide", spy)
    costs = StepCosts(hand_cost.base_ms, hand_cost.per_prefill_token_ms,
                      hand_cost.per_decode_seq_ms)
    setup = SimSetup(Layout.parse("1R1P1D"), hand_cost,
                     RoutingPolicy(PolicyConfig(kind=Policy.LIVE), costs=costs), NVLINK,
                     LLAMA_KV)
    # a finds every node idle: the replica answers sooner and delays nobody. b comes while a
    # decodes on the replica: its 2,000-token prefill there would stall a's short reply for
    # 200 ms, worth more than the 25 ms of TTFT the replica saves over P->D.
    turns = (SimTurn(2000, 20), SimTurn(20, 5), SimTurn(20, 5))
    arrivals = [Arrival(0.0, SimConversation("a", turns)),
                Arrival(0.3, SimConversation("b", turns))]
    records = Simulator(setup).run(arrivals).records
    served = {(r.conversation_id, r.turn): (r.route, r.decode) for r in records}
    assert all(r.success for r in records) and len(records) == 6
    assert [served[("a", t)] for t in (1, 2, 3)] == [("replica", "http://r0.sim")] * 3
    assert served[("b", 1)] == ("pd", "http://d0.sim")
    assert {served[("b", t)][1] for t in (2, 3)} == {"http://d0.sim"}
    reasons = [(turn, d.reason.value) for turn, d in decisions]
    assert reasons.count((1, "replica_live")) == 1 and reasons.count((1, "turn1")) == 1
    assert reasons.count((2, "replica_home")) == 1 and reasons.count((3, "replica_home")) == 1


def test_hybrid_layouts_parse_in_any_order() -> None:
    assert Layout.parse("1R1P2D") == Layout.parse("1P2D1R") == Layout(1, 2, 1)
    assert Layout.parse("2r1p1d").name == "1P1D2R"
    for bad in ("1P1P2D", "1R1P", "1X2D", "P2D"):
        with pytest.raises(LayoutError):
            Layout.parse(bad)


def test_the_grid_runs_hybrids_under_every_policy_but_replica(hand_preset: str) -> None:
    assert expand_layouts(["1P3D", "hybrids"]) == ["1P3D", *HYBRID_LAYOUTS]
    base = RunSpec(layout="1P1D", dataset="synthetic:small-tiny", qps=1.0, cost=hand_preset)
    cells = grid_cells(["1P2D1R", "4R"], ["synthetic:small-tiny"], [1.0],
                       ["pd", "live", "replica"], base, lambda _: None)
    assert [(c.spec.layout, c.policy) for c in cells] == [
        ("1P2D1R", "pd"), ("1P2D1R", "live"), ("4R", "replica")]

"""Policy live in the simulator: the engines' prefix caches are its residency."""

from __future__ import annotations

from pathlib import Path

import pytest

import proxy.policies.live
from profiler.engine import LinearCost
from profiler.engine.config import EngineConfig
from profiler.engine.transfer import load_link, load_model_shape
from profiler.simulator import cli as sim_cli
from profiler.simulator.grid import parse_policy
from profiler.simulator.live_costs import fit_step_costs
from profiler.simulator.run import policy_label
from profiler.simulator.virtual_cluster import SimSetup, Simulator
from profiler.simulator.workload import Arrival, SimConversation, SimTurn
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.predict import StepCosts
from proxy.policies.routing import RoutingPolicy
from proxy.shared.vocabulary import Decision, Layout, RouteKind

NVLINK = load_link("nvlink")
LLAMA_KV = load_model_shape("llama-3.1-8b").kv_bytes_per_token


def _run(hand_cost: LinearCost, blocks: int, monkeypatch: pytest.MonkeyPatch,
         ttl: float | None = None) -> tuple[list[tuple[str, int, str]], list[Decision]]:
    decisions: list[Decision] = []
    predicted = proxy.policies.live._predicted

    def spy(turn, state, inputs, scorer):  # type: ignore[no-untyped-def]
        decision, scorer = predicted(turn, state, inputs, scorer)
        decisions.append(decision)
        return decision, scorer

    monkeypatch.setattr(proxy.policies.live, "_predicted", spy)
    costs = StepCosts(hand_cost.base_ms, hand_cost.per_prefill_token_ms,
                      hand_cost.per_decode_seq_ms)
    setup = SimSetup(Layout.parse("1P1D"), hand_cost,
                     RoutingPolicy(PolicyConfig(kind=Policy.LIVE), costs=costs), NVLINK,
                     LLAMA_KV, engine=EngineConfig(num_kv_blocks=blocks), readback_ttl_s=ttl)
    # b decodes long and holds its blocks; a's turn 1 fills most of the rest; c waits on D for
    # room and gets it when a's turn 1 ends - by evicting a's blocks, just before a's turn 2.
    arrivals = [Arrival(0.0, SimConversation("b", (SimTurn(200, 40),))),
                Arrival(0.001, SimConversation("a", (SimTurn(300, 3), SimTurn(20, 2)))),
                Arrival(0.002, SimConversation("c", (SimTurn(300, 3),)))]
    result = Simulator(setup).run(arrivals)
    return [(r.conversation_id, r.turn, r.route) for r in result.records], decisions


def test_evicted_session_goes_p_to_d_and_a_resident_one_stays_local(
        hand_cost: LinearCost, monkeypatch: pytest.MonkeyPatch) -> None:
    small, evicted = _run(hand_cost, 40, monkeypatch)  # 640 tokens of KV cache on each node
    assert ("a", 2, "pd") in small
    assert [d.reason.value for d in evicted] == ["evicted"]
    large, resident = _run(hand_cost, 4096, monkeypatch)
    assert ("a", 2, "local") in large
    assert [d.reason.value for d in resident] == ["live"]


def test_blocks_d_keeps_for_a_readback_are_not_evicted(
        hand_cost: LinearCost, monkeypatch: pytest.MonkeyPatch) -> None:
    # As above, with D keeping each finished turn's blocks for a readback (vLLM's
    # bidirectional NIXL): a's turn-1 blocks are pinned, so c cannot evict them and a's
    # history is still on D at turn 2; c waits until b's and a's pins are freed.
    pinned, decisions = _run(hand_cost, 40, monkeypatch, ttl=0.5)
    assert ("a", 2, "local") in pinned
    assert [d.reason.value for d in decisions] == ["live"]


def _c_ttft(cost: LinearCost, ttl: float | None, policy: Policy = Policy.READBACK,
            forced: RouteKind | None = None,
            earlier: tuple[Arrival, ...] | None = None, c_at: float = 0.002) -> float:
    """c's TTFT (300 tokens) after `earlier` conversations' finished turns (by default b's
    and a's), on a D of 40 blocks; `forced`: the route of every turn 2+."""
    setup = SimSetup(Layout.parse("1P1D"), cost, RoutingPolicy(PolicyConfig(kind=policy)),
                     NVLINK, LLAMA_KV, engine=EngineConfig(num_kv_blocks=40),
                     readback_ttl_s=ttl,
                     forced=(lambda turn: forced if turn >= 2 else None) if forced else None)
    records = Simulator(setup).run([
        *(earlier if earlier is not None else (
            Arrival(0.0, SimConversation("b", (SimTurn(200, 40),))),
            Arrival(0.001, SimConversation("a", (SimTurn(300, 3),))))),
        Arrival(c_at, SimConversation("c", (SimTurn(300, 3),)))]).records
    ttft = next(r.ttft_s for r in records if r.conversation_id == "c")
    assert ttft is not None
    return ttft


def test_a_pinned_cache_makes_a_new_request_wait_for_the_ttl(hand_cost: LinearCost) -> None:
    # b's and a's finished P->D turns pin most of D's 40 blocks; c's 300-token prompt gets
    # room only when their 0.5 s TTL ends (without readback it evicts a's blocks at once).
    # vLLM pins every P->D D leg on such nodes, whatever the policy (TurnMachine.pins).
    for policy in (Policy.READBACK, Policy.PD):
        assert _c_ttft(hand_cost, None, policy) < 0.5 < _c_ttft(hand_cost, 0.5, policy)


def test_a_local_turn_pins_its_blocks_only_for_a_policy_that_reads_back(
        hand_cost: LinearCost) -> None:
    # a: a P->D turn 1 (pinned: a D leg) and a long local turn 2. Under a policy that reads
    # back the local leg asks D to keep its blocks (KEEP_BLOCKS), which fill D until the TTL;
    # under pd (the route forced) it asks nothing and D frees them when the turn ends.
    a = (Arrival(0.0, SimConversation("a", (SimTurn(100, 3), SimTurn(300, 3)))),)

    def c_ttft(policy: Policy) -> float:
        return _c_ttft(hand_cost, 0.5, policy, RouteKind.LOCAL, earlier=a, c_at=0.2)

    assert c_ttft(Policy.PD) < 0.2 < 0.3 < c_ttft(Policy.READBACK)


def test_live_sees_the_room_d_has_for_new_kv_pinned_blocks_counted_as_used(
        hand_cost: LinearCost) -> None:
    from profiler.engine.engine import Engine
    from profiler.engine.requests import Request
    from profiler.simulator.cluster_state import node_state

    engine = Engine(EngineConfig(num_kv_blocks=40, block_size=16), hand_cost)
    assert node_state(engine, None).free_kv_tokens == 640
    engine.submit(Request("r", max_tokens=2, prompt_token_ids=list(range(100))), 0.0)
    engine.step(0.0)
    # 100 prompt tokens (and the first output) in 7 blocks of 16: 33 blocks of room left.
    assert node_state(engine, None).free_kv_tokens == 33 * 16


def test_fitted_costs_of_a_linear_preset_are_the_preset(hand_cost: LinearCost) -> None:
    costs = fit_step_costs(hand_cost, NVLINK, LLAMA_KV)
    assert costs.step_ms(100, 0, 3, 0) == pytest.approx(10 + 10 + 3)
    assert costs.transfer_ms(1000) == pytest.approx(5e-3 + 1000 * LLAMA_KV / 450e9 * 1000)


def test_grid_labels() -> None:
    assert parse_policy("live").kind is Policy.LIVE
    config = parse_policy("live-wtpot3")
    assert config.w_tpot == 3.0 and policy_label(config) == "live-wtpot3"
    with pytest.raises(ValueError, match="needs a decision table"):
        parse_policy("live-table")


def test_live_costs_command_writes_a_file_the_proxy_reads(hand_preset: str,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "costs.json"
    assert sim_cli.main(["live-costs", "--cost", hand_preset, "--model", "llama-3.1-8b",
                         "--out", str(out)]) == 0
    costs = StepCosts.load(out)
    assert costs.step_ms(100, 0, 3, 0) == pytest.approx(10 + 10 + 3)
    with pytest.raises(SystemExit):  # a preset file names no model: the KV size is needed
        sim_cli.main(["live-costs", "--cost", hand_preset, "--out", str(out)])


def test_a_hosted_preset_adds_its_hand_off_descriptors_and_front_end(
        hand_cost: LinearCost) -> None:
    from profiler.engine.host import HostedCost, HostModel

    host = HostModel(frontend_request_ms=30.0, kv_handoff_ms=12.0, kv_per_token_us=50.0,
                     frontend_per_token_us=0.5, kv_descriptor_us=4.0, descriptors_per_block=64)
    hosted = HostedCost("hosted", hand_cost, host)
    bare = fit_step_costs(hand_cost, NVLINK, LLAMA_KV)
    costs = fit_step_costs(hosted, NVLINK, LLAMA_KV, block_size=16)
    assert costs.transfer_ms(0) == pytest.approx(bare.transfer_ms(0) + 12.0)
    # Per token: the connector's 50 us and 64 descriptors of 4 us per 16-token block - what
    # the simulator's hand-off charges a 2,000-token pull.
    per_token_us = 50.0 + 4.0 * 64 / 16
    assert costs.transfer_ms(2000) - costs.transfer_ms(0) == pytest.approx(
        bare.transfer_ms(2000) - bare.transfer_ms(0) + 2000 * per_token_us / 1000)
    assert costs.transfer_ms(2000) - bare.transfer_ms(2000) == pytest.approx(
        host.handoff_s(2000, 16) * 1000)
    # One pass through an API server: what every route pays per front end.
    assert costs.frontend_ms(2000) == pytest.approx(host.frontend_s(2000) * 1000)
    assert bare.frontend_ms(2000) == 0.0

def test_a_readback_first_passes_ps_api_server_for_its_tokenize() -> None:
    # The proxy asks P's /tokenize before the read (proxy.readback.protocol): on an idle 1P1D where
    # P
    # still holds turn 1's prompt, a readback reads only the 100-token reply (about what it
    # saves P computing) and answers about one front end after pd.
    from profiler.engine.presets import cached_cost
    from profiler.simulator.run import RunSpec, setup_for
    from proxy.shared.vocabulary import RouteKind

    def turn2_ttft(route: RouteKind) -> float:
        # Under a policy that reads back (D keeps nothing for pd); the forced route rules.
        setup = setup_for(RunSpec(layout="1P1D", dataset="-", qps=1.0, forced_route=route,
                                  policy=PolicyConfig(kind=Policy.READBACK)))
        conversation = SimConversation("c", (SimTurn(600, 100), SimTurn(60, 50)))
        records = Simulator(setup).run([Arrival(0.0, conversation)]).records
        second = next(r for r in records if r.turn == 2)
        assert second.route == route.value and second.ttft_s is not None
        return second.ttft_s

    front_end = cached_cost("h100:llama-3.1-8b").host.frontend_s(760)
    extra = turn2_ttft(RouteKind.READBACK) - turn2_ttft(RouteKind.PD)
    assert front_end <= extra < front_end + 0.005

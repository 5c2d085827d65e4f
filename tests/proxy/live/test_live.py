"""Policy live: both routes predicted from residency, load and a step-cost model."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from proxy.config.cluster_file import NodeSpec
from proxy.config.config_files import ConfigError
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.config.settings import ProxyConfig
from proxy.live.predict import (
    NodeState,
    StepCosts,
    TurnState,
    predict,
    predict_placement,
)
from proxy.live.scorer import LiveScorer
from proxy.policies.routing import RoutingPolicy
from proxy.shared.vocabulary import Reason, Role, RouteKind, Workload

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
    # P->D's P computes the same either way; D pulls only what its own cache lacks.
    assert evicted.ttft_pd_ms - resident.ttft_pd_ms == pytest.approx(2048 * 0.3 / 1000)
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
    # 4,096 new tokens after 4,096 held, one request decoding: local saves more time than it
    # stalls (`proxy.live.nodes.saves_time`), so the score decides.
    paste = turn(n_ctx=4096, n_in=4096, n_out=512)
    busy = state(4096, running=1)
    balanced = RoutingPolicy(LIVE, costs=COSTS)
    heavy = RoutingPolicy(PolicyConfig(kind=Policy.LIVE, w_tpot=200.0), costs=COSTS)
    assert balanced.decide(paste, "s", True, busy).kind is RouteKind.LOCAL
    decision = heavy.decide(paste, "s", True, busy)
    assert decision.kind is RouteKind.PD and decision.reason is Reason.LIVE


def test_a_big_paste_stalling_a_busy_ds_batch_more_than_it_saves_goes_p_to_d() -> None:
    # 1,024 new tokens: about 20 ms of prefill beside each of 60 running requests (1.2 s of
    # stall) against the ~35 ms P->D would add to this turn (`proxy.live.nodes.saves_time`).
    paste = turn(n_ctx=512, n_in=1024, n_out=512)
    policy = RoutingPolicy(LIVE, costs=COSTS)
    assert policy.decide(paste, "s", True, state(512, running=1)).kind is RouteKind.LOCAL
    decision = policy.decide(paste, "s", True, state(512, running=60))
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


def test_the_batch_own_output_lengths_price_local_when_known() -> None:
    # A request of 2,000 output tokens barely notices a delay; one of 10 tokens feels it two
    # hundred times more (one request decoding: local saves more time than it stalls).
    paste = turn(n_ctx=4096, n_in=4096, n_out=512)
    long_batch = TurnState(NodeState(1, 0, 4096, 16, tpot_sensitivity=1 / 1999), NodeState())
    short_batch = TurnState(NodeState(1, 0, 4096, 16, tpot_sensitivity=1 / 9), NodeState())
    heavy = PolicyConfig(kind=Policy.LIVE, w_tpot=6.0)
    assert RoutingPolicy(heavy, costs=COSTS).decide(paste, "s", True, long_batch).kind \
        is RouteKind.LOCAL
    assert RoutingPolicy(heavy, costs=COSTS).decide(paste, "s", True, short_batch).kind \
        is RouteKind.PD


def test_live_view_trusts_fresh_metrics_else_the_proxy_in_flight() -> None:
    from proxy.live.kv_events import BlockStored
    from proxy.live.residency import Residency
    from proxy.live.view import LiveView
    from proxy.observability.node_gauges import NodeGauges, NodeMetrics
    from proxy.sessions.session import Session
    from proxy.upstream.backends import BackendPool

    now = [10.0]
    pool = BackendPool(clock=lambda: now[0])
    pool.add("http://p", Role.PREFILL)
    decode = pool.add("http://d", Role.DECODE)
    residency = Residency()
    residency.node("http://d").apply(BlockStored((1, 2), None, 64, 32, "s"))
    signals = NodeGauges(clock=lambda: now[0])
    signals.latest["http://d"] = NodeMetrics(running=40, waiting=2, kv_usage=0.75, at=9.0,
                                             kv_blocks=1000, kv_block_size=16)
    view = LiveView(pool, residency, signals, max_age=3.0)
    session = Session("s", opening="o", hashed=False, decode="http://d")
    state = view.state(session)
    assert (state.decode.running, state.decode.waiting) == (40, 2)
    assert state.decode.free_kv_tokens == 4000  # a quarter of 1,000 blocks of 16 tokens
    assert (state.decode.held_tokens, state.decode.block_size) == (64, 32)
    assert state.prefill.held_tokens is None  # P publishes nothing
    assert state.decode.tpot_sensitivity is None  # no stream of the proxy's own there
    first = view.streaming("http://d", 11)
    view.streaming("http://d", 21)
    # Two own streams, 40 running by /metrics: their 1/10 + 1/20, scaled to the batch.
    assert view.state(session).decode.tpot_sensitivity == pytest.approx(0.15 * 20)
    view.done(first)
    view.done(first)  # twice is harmless
    assert view.state(session).decode.tpot_sensitivity == pytest.approx(0.05 * 40)
    now[0] = 20.0  # the reading is 11 s old: the proxy's own count stands in
    decode.in_flight = 3
    stale = view.state(session).decode
    assert (stale.running, stale.waiting) == (3, 0)
    assert stale.free_kv_tokens is None  # not known from the proxy's own counts
    assert stale.tpot_sensitivity == pytest.approx(0.05 * 3)


def test_placement_prices_a_replica_as_a_whole_prompt_prefill_beside_its_batch() -> None:
    first = Workload(1, 500, 0, 100, 4.0)
    replica = NodeState(10.0, 2.0, None, 16, 0.5)
    placed = predict_placement(first, TurnState(NodeState(), NodeState(), replica), COSTS)
    step = 6.0 + 10 * 0.01  # the replica's decode step
    assert placed.ttft_local_ms == pytest.approx(step / 2 + 2 * step + step + 500 * 0.02)
    assert placed.delay_ms == pytest.approx(500 * 0.02)  # the batch waits for the prefill
    assert placed.batch_delay_ms == pytest.approx(10 * 500 * 0.02)
    assert placed.tpot_sensitivity == 0.5
    # P->D is predict's: P's prefill of the prompt, D's three steps, the transfer.
    assert placed.ttft_pd_ms == pytest.approx(16.0 + 3.0 + 6.0 + 0.15 + 3.0 + 6.01)
    cached = predict_placement(first, TurnState(NodeState(), NodeState(),
                                                NodeState(10.0, 2.0, 320, 16)), COSTS)
    assert placed.ttft_local_ms - cached.ttft_local_ms == pytest.approx(320 * 0.02)


def test_placement_charges_each_route_for_the_batch_it_joins() -> None:
    # A decode step also costs 0.04 ms per thousand tokens of KV: a request of 500 prompt
    # tokens and 100 output ones (550 on average while it decodes) lengthens every step of
    # its batch by c = 0.01 + 0.04 x 0.55 = 0.032 ms.
    costs = StepCosts(base_ms=6.0, per_prefill_token_ms=0.02, per_decode_seq_ms=0.01,
                      per_decode_kv_ktoken_ms=0.04)
    first = Workload(1, 500, 0, 100, 4.0)
    # The replica decodes 40 requests of 200 tokens (known), D 10 of unknown length.
    replica = NodeState(40.0, 0.0, None, 16, tpot_sensitivity=40 / 199)
    decode = NodeState(10.0, 0.0, None, 16)
    placed = predict_placement(first, TurnState(decode, NodeState(), replica), costs)
    on_replica, on_d = placed.joins_local, placed.joins_pd
    assert on_replica is not None and on_d is not None
    assert on_replica.per_step_ms == pytest.approx(0.032)
    assert on_replica.own_step_ms == pytest.approx(6.0 + 41 * 0.032)  # step(B + 1 decodes)
    assert on_d.own_step_ms == pytest.approx(6.0 + 11 * 0.032)
    scorer = LiveScorer(1.0, 1.0, n_out=200.0)  # the mean output so far
    # The replica's 40 others: min(1, 100 / 199) of their tokens each, from their lengths
    # (100 x 40 / 199 = 20.1 requests' worth); D's 10: min(1, 100 / 200) from the mean.
    m_replica = 6.0 + 41 * 0.032 + 0.032 * 100 * 40 / 199
    m_d = 6.0 + 11 * 0.032 + 0.032 * 10 * 0.5
    assert scorer.membership_ms(on_replica) == pytest.approx(m_replica)
    assert scorer.membership_ms(on_d) == pytest.approx(m_d)
    # The score pays the difference over the mean step, weight 1 for turn 1 (the replica's
    # bigger batch: positive, so against the replica), on top of the prefill's delay.
    without = replace(placed, joins_local=None, joins_pd=None)
    step_ref = placed.decode_step_ms  # the scorer's first turn: its own values are the means
    assert scorer.score(without, first_turn=True) - scorer.score(placed, first_turn=True) \
        == pytest.approx((m_replica - m_d) / step_ref)
    # Swapping the batches flips the sign.
    swapped = predict_placement(first, TurnState(replica, NodeState(), decode), costs)
    assert swapped.joins_local is not None and swapped.joins_pd is not None
    assert scorer.membership_ms(swapped.joins_local) < scorer.membership_ms(swapped.joins_pd)


def test_membership_weight_is_one_for_turn_one_and_the_turns_left_for_a_replacement() -> None:
    scorer = LiveScorer(1.0, 1.0, followup_share=0.75)  # conversations of four turns on average
    assert scorer.membership_weight(first_turn=True) == 1.0
    # Per turn-2+ decision (share 0.75), a re-placed conversation has four turns left.
    assert scorer.membership_weight(first_turn=False) == pytest.approx(0.75 * 4)
    scorer = scorer._replace(followup_share=1.0)  # only re-placements seen: bounded
    assert scorer.membership_weight(first_turn=False) == pytest.approx(20.0)


def test_readback_is_pd_with_ps_prefill_cut_to_the_new_tokens_plus_the_read() -> None:
    off = predict(turn(), state(2048), COSTS)
    on = predict(turn(), replace(state(2048), readback=True), COSTS)
    assert off.ttft_readback_ms is None
    assert on.ttft_readback_ms is not None
    # P computes 64 tokens instead of 2,112, and reads 2,048 tokens' KV (0.3 ms per 1k).
    assert on.ttft_pd_ms - on.ttft_readback_ms == pytest.approx(2048 * 0.02 - 2.048 * 0.3)
    # What P holds already is neither read nor computed.
    warm = predict(turn(), replace(state(2048, p_held=2000), readback=True), COSTS)
    assert warm.ttft_pd_ms - warm.ttft_readback_ms == pytest.approx(48 * 0.02 - 0.048 * 0.3)


def test_readback_score_is_its_ttft_gain_over_pd() -> None:
    scorer = LiveScorer(w_ttft=2.0, w_tpot=3.0)
    prediction = predict(turn(), replace(state(2048), readback=True), COSTS)
    scorer.score(prediction)
    gain = prediction.ttft_pd_ms - (prediction.ttft_readback_ms or 0.0)
    assert scorer.readback_score(prediction) == pytest.approx(2.0 * gain / prediction.ttft_pd_ms)
    assert scorer.readback_score(predict(turn(), state(2048), COSTS)) is None


def test_live_reads_back_where_local_would_stall_the_batch() -> None:
    policy = RoutingPolicy(replace(LIVE, w_tpot=3.0), costs=COSTS)
    paste = turn(n_in=1024)
    # A small batch: local's append-prefill costs it little, and local's TTFT is the lowest.
    calm = policy.decide(paste, "s", True, replace(state(2048, running=2), readback=True))
    assert calm.kind is RouteKind.LOCAL
    # A 1,024-token append beside 128 decodes costs their TPOT more than local's TTFT gains:
    # readback keeps P->D's TPOT without P's whole-history prefill.
    busy = policy.decide(paste, "s", True, replace(state(2048, running=128), readback=True))
    assert busy.kind is RouteKind.READBACK and busy.reason is Reason.LIVE
    # The same turn without blocks to read back goes P->D.
    assert policy.decide(paste, "s", True, state(2048, running=128)).kind is RouteKind.PD


def test_readback_is_priced_only_while_d_has_room_for_the_whole_prompt() -> None:
    # P's read frees D's kept copy; a D without room for the whole prompt gives those blocks
    # to its waiting requests and the D leg then waits to receive the history again.
    def on(free: int | None) -> TurnState:
        busy = NodeState(128.0, 0.0, 2048, 16, free_kv_tokens=free)
        return TurnState(busy, NodeState(0.0, 0.0, None, 16), readback=True)

    paste = turn(n_in=1024)
    assert predict(paste, on(None), COSTS).ttft_readback_ms is not None  # room unknown
    assert predict(paste, on(2048 + 1024), COSTS).ttft_readback_ms is not None
    assert predict(paste, on(2048 + 1023), COSTS).ttft_readback_ms is None
    policy = RoutingPolicy(replace(LIVE, w_tpot=3.0), costs=COSTS)
    assert policy.decide(paste, "s", True, on(10_000)).kind is RouteKind.READBACK
    assert policy.decide(paste, "s", True, on(1_000)).kind is RouteKind.PD


def test_a_readback_that_gains_nothing_is_not_taken() -> None:
    # P already holds the whole history: reading it back saves nothing over P->D.
    policy = RoutingPolicy(replace(LIVE, w_tpot=3.0), costs=COSTS)
    warm = replace(state(2048, running=128, p_held=2048), readback=True)
    assert policy.decide(turn(n_in=1024), "s", True, warm).kind is RouteKind.PD


def test_each_route_pays_its_front_ends_local_one_pd_two_readback_three() -> None:
    fronted = replace(COSTS, frontend_base_ms=10.0, frontend_ms_per_ktoken=1.0)
    on = replace(state(2048), readback=True)
    bare, with_front = predict(turn(), on, COSTS), predict(turn(), on, fronted)
    one = 10.0 + 1.0 * (2048 + 64) / 1000  # the whole prompt passes each API server
    assert with_front.ttft_local_ms - bare.ttft_local_ms == pytest.approx(one)
    assert with_front.ttft_pd_ms - bare.ttft_pd_ms == pytest.approx(2 * one)
    assert with_front.ttft_readback_ms is not None and bare.ttft_readback_ms is not None
    assert with_front.ttft_readback_ms - bare.ttft_readback_ms == pytest.approx(3 * one)


def test_the_requests_queued_on_d_wait_out_locals_step_too() -> None:
    # 4,000 missing tokens re-prefilled beside a batch of 8: an 80 ms longer step, which each
    # of the 6 requests queued on D also waits before its first token
    workload = Workload(2, 64, 4000, 256, 4.0)
    idle_queue = TurnState(NodeState(8.0, 0.0, 0, 16), NodeState(0.0, 0.0, None, 16))
    queued = TurnState(NodeState(8.0, 6.0, 0, 16), NodeState(0.0, 0.0, None, 16))
    alone, behind = predict(workload, idle_queue, COSTS), predict(workload, queued, COSTS)
    assert alone.queue_delay_ms == 0.0
    assert behind.queue_delay_ms == pytest.approx(6 * behind.delay_ms)
    scorer = LiveScorer(1.0, 1.0)
    # the same turn scores lower by the queue's delay over the reference TTFT
    ref = behind.ttft_pd_ms
    drop = scorer.score(replace(behind, queue_delay_ms=0.0)) - scorer.score(behind)
    assert drop == pytest.approx(behind.queue_delay_ms / ref)

"""Which D and P a live turn uses (`proxy.live.nodes`): nodes read from the view, priced by
`proxy.live.predict`'s model; a D without room for the prompt is passed over while another has
it."""

from __future__ import annotations

import pytest

from proxy.live.cluster_view import ClusterView, NodeView
from proxy.live.nodes import (
    least_prefill_work,
    node_state,
    placement_decode,
    placement_local,
    prefill_arrivals_delayed,
    prefill_wait_ms,
    roomy,
    saves_time,
)
from proxy.live.predict import NodeState, Prediction, StepCosts
from proxy.live.scorer import LiveScorer
from proxy.shared.vocabulary import Role, Workload

COSTS = StepCosts(base_ms=6.0, per_prefill_token_ms=0.02, per_decode_seq_ms=0.01,
                  per_decode_kv_ktoken_ms=0.01, transfer_ms_per_ktoken=0.3)
SCORER = LiveScorer(1.0, 1.0)
FIRST = Workload(1, 4000, 0, 256, 1.0)


def _d(url: str, running: float = 0.0, usage: float = 0.0, **fields: object) -> NodeView:
    return NodeView(url, Role.DECODE, running=running, waiting=0.0, kv_usage=usage,
                    kv_blocks=1000, kv_block_size=16, **fields)  # type: ignore[arg-type]


def test_a_views_node_becomes_what_live_reads() -> None:
    state = node_state(_d("d", running=3.0, usage=0.25, held_tokens=160))
    assert state == NodeState(3.0, 0.0, 160, 16, None, 12_000)
    assert node_state(NodeView("d", Role.DECODE, in_flight=2)) == NodeState(2.0, 0.0, None, 16)


def test_room_is_the_free_kv_for_the_prompt_and_every_node_when_none_has_it() -> None:
    full, free = _d("full", usage=0.9), _d("free", usage=0.5)  # 1,600 and 8,000 tokens free
    assert roomy((full, free), 4000) == (free,)
    assert roomy((full, free), 9000) == (full, free)


def test_a_new_conversation_decodes_on_the_lighter_batch() -> None:
    view = ClusterView((_d("busy", running=120.0, usage=0.4), _d("light", running=4.0,
                                                                  usage=0.1)))
    chosen = placement_decode(FIRST, view, NodeState(), COSTS, SCORER)
    assert chosen is not None and chosen.url == "light"


def test_a_d_without_room_is_passed_over_however_light() -> None:
    view = ClusterView((_d("full", running=1.0, usage=0.9), _d("roomy", running=60.0,
                                                                usage=0.3)))
    chosen = placement_decode(FIRST, view, NodeState(), COSTS, SCORER)
    assert chosen is not None and chosen.url == "roomy"


def test_equal_ds_go_to_the_pools_order_and_the_p_to_the_shortest_queue() -> None:
    view = ClusterView((_d("d0", in_flight=2), _d("d1", in_flight=1),
                        NodeView("p0", Role.PREFILL, running=1.0, waiting=3.0),
                        NodeView("p1", Role.PREFILL, running=2.0, waiting=0.0)))
    chosen = placement_decode(FIRST, view, NodeState(), COSTS, SCORER)
    assert chosen is not None and chosen.url == "d1"
    queue = least_prefill_work(view, 4000)
    assert queue is not None and queue.url == "p1"
    assert placement_decode(FIRST, ClusterView(()), NodeState(), COSTS, SCORER) is None


def test_requests_in_flight_beyond_the_gauges_join_ds_batch_and_ps_queue() -> None:
    d = node_state(NodeView("d", Role.DECODE, in_flight=5, running=1.0, waiting=1.0))
    p = node_state(NodeView("p", Role.PREFILL, in_flight=5, running=1.0, waiting=1.0))
    assert (d.running, d.waiting) == (4.0, 1.0)
    assert (p.running, p.waiting) == (1.0, 4.0)
    # gauges that already show more than the proxy sent are taken as they are
    assert node_state(NodeView("d", Role.DECODE, in_flight=1, running=9.0)).running == 9.0
    # a burst between two scrapes: both Ps read idle, the one the proxy loaded less wins
    view = ClusterView((NodeView("p0", Role.PREFILL, in_flight=3, running=0.0, waiting=0.0),
                        NodeView("p1", Role.PREFILL, in_flight=1, running=0.0, waiting=0.0)))
    chosen = least_prefill_work(view, 4000)
    assert chosen is not None and chosen.url == "p1"


def test_the_p_with_less_prefill_work_wins_over_the_one_with_fewer_requests() -> None:
    # p0: one 90,000-token prompt admitted; p1: three requests holding 6,000 tokens
    view = ClusterView((NodeView("p0", Role.PREFILL, running=1.0, waiting=0.0, kv_usage=0.9,
                                 kv_blocks=6250, kv_block_size=16),
                        NodeView("p1", Role.PREFILL, running=3.0, waiting=0.0, kv_usage=0.06,
                                 kv_blocks=6250, kv_block_size=16)))
    chosen = least_prefill_work(view, 4000)
    assert chosen is not None and chosen.url == "p1"
    # a queue counts at this turn's size: 24 waiting 4,000-token turns outweigh the long one
    view = ClusterView((view.nodes[0], NodeView("p1", Role.PREFILL, running=0.0, waiting=24.0,
                                                kv_usage=0.0, kv_blocks=6250,
                                                kv_block_size=16)))
    chosen = least_prefill_work(view, 4000)
    assert chosen is not None and chosen.url == "p0"


def test_turns_arriving_during_an_append_wait_half_its_delay() -> None:
    from proxy.live.nodes import arrivals_delayed
    from proxy.live.predict import Prediction

    # a 100 ms step made 900 ms longer: over one second, 4 turns/s over 2 Ds bring 2 turns to
    # this D, each 450 ms later on average
    base = Prediction(500.0, 900.0, 100.0, 0.0, 0, delay_ms=900.0, queue_delay_ms=30.0)
    two = ClusterView((_d("d0"), _d("d1")))
    delayed = arrivals_delayed(Workload(2, 64, 8000, 256, 4.0), two, base)
    assert delayed.queue_delay_ms == pytest.approx(30.0 + 2 * 450.0)
    # six Ds share the same load: a third as many turns reach this one
    six = ClusterView(tuple(_d(f"d{i}") for i in range(6)))
    assert arrivals_delayed(Workload(2, 64, 8000, 256, 4.0), six, base).queue_delay_ms == \
        pytest.approx(30.0 + 2 / 3 * 450.0)


def _prediction(ttft_local: float, batch: float = 0.0, queue: float = 0.0,
                pd_queue: float = 0.0) -> Prediction:
    return Prediction(ttft_local, 0.0, 7.0, batch, 0, 0.0, queue_delay_ms=queue,
                      pd_queue_delay_ms=pd_queue)


def test_local_saves_time_only_when_what_it_skips_outweighs_its_answer_and_ds_stall() -> None:
    assert saves_time(_prediction(100.0, batch=50.0, queue=20.0), 171.0)
    assert not saves_time(_prediction(100.0, batch=50.0, queue=20.0), 170.0)
    # the wait P->D's prefill adds to the turns behind it on P counts with what it skips
    assert saves_time(_prediction(100.0, batch=50.0, queue=20.0, pd_queue=30.0), 141.0)


def test_ps_wait_counts_its_queue_and_half_its_running_prefills_at_the_mean_prompt() -> None:
    step = COSTS.step_ms(8000, 0, 0, 0)
    scorer = SCORER._replace(prompt=8000.0)
    assert prefill_wait_ms(NodeState(2.0, 3.0), COSTS, scorer, 500) == pytest.approx(4 * step)
    assert prefill_wait_ms(NodeState(), COSTS, scorer, 500) == 0.0
    # before live has seen a prompt: this turn's
    assert prefill_wait_ms(NodeState(0.0, 1.0), COSTS, SCORER, 8000) == pytest.approx(step)


def test_turns_behind_a_prefill_on_p_wait_it_out() -> None:
    view = ClusterView((NodeView("p0", Role.PREFILL), NodeView("p1", Role.PREFILL)))
    step = COSTS.step_ms(4000, 0, 0, 0)
    turn = Workload(1, 4000, 0, 256, 4.0)  # 2 turns a second reach each P
    idle = prefill_arrivals_delayed(turn, view, _prediction(0.0), NodeState(), COSTS)
    assert idle.pd_queue_delay_ms == pytest.approx(2.0 / 1000 * step * step / 2)
    queued = prefill_arrivals_delayed(turn, view, _prediction(0.0), NodeState(1.0, 2.0), COSTS)
    assert queued.pd_queue_delay_ms == pytest.approx(2.0 / 1000 * (3 * step * step
                                                                   + step * step / 2))


def _p(running: float, waiting: float) -> NodeView:
    return NodeView("p", Role.PREFILL, running=running, waiting=waiting)


def test_a_first_turn_is_served_on_an_idle_d_only_while_p_is_backed_up() -> None:
    busy = (_d("busy", running=60.0, usage=0.3), _d("idle", running=2.0, usage=0.1))
    turn = Workload(1, 4000, 0, 256, 2.0)
    scorer = SCORER._replace(prompt=12000.0)
    backed_up = ClusterView((*busy, _p(2.0, 10.0)))
    placed = placement_local(turn, backed_up, node_state(_p(2.0, 10.0)), busy[1], COSTS, scorer)
    assert placed is not None and placed[1].url == "idle"
    assert placed[0].ttft_local_ms < placed[0].ttft_pd_ms
    free = ClusterView((*busy, _p(0.0, 0.0)))
    assert placement_local(turn, free, node_state(_p(0.0, 0.0)), busy[1], COSTS, scorer) is None


def test_no_d_without_room_for_the_prompt_serves_a_first_turn() -> None:
    full = _d("full", running=1.0, usage=0.9)  # 1,600 tokens free
    view = ClusterView((full, _p(2.0, 10.0)))
    turn = Workload(1, 4000, 0, 256, 2.0)
    assert placement_local(turn, view, node_state(_p(2.0, 10.0)), full, COSTS,
                           SCORER._replace(prompt=12000.0)) is None

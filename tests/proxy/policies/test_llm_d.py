"""llm-d's rule (`proxy.policies.llm_d`): decode pod by prefix x2 + queue x1, P skipped while
that pod lacks fewer than 16 of the prompt's tokens."""

from __future__ import annotations

import pytest

from proxy.config.policy_config import PolicyConfig
from proxy.policies.base import Inputs
from proxy.policies.llm_d import NAME, decide
from proxy.policies.routing import RoutingPolicy
from proxy.routing.turn_plan import plan_turn
from proxy.sessions.session import Lookup, Session
from proxy.shared.vocabulary import Decision, Reason, Role, RouteKind
from proxy.upstream.backends import BackendPool
from tests.proxy.policies.views import D0, D1, P0, P1, node, turn, view

INPUTS = Inputs(PolicyConfig(kind=NAME))


@pytest.mark.parametrize(("n_in", "kind"), [(15, RouteKind.LOCAL), (16, RouteKind.PD)])
def test_p_is_skipped_below_16_uncached_tokens_on_the_chosen_d(n_in: int,
                                                                kind: RouteKind) -> None:
    cluster = view(node(P0), node(P1), node(D0, held_tokens=1000), node(D1, held_tokens=0))
    decision = decide(turn(1000, n_in, cluster), INPUTS)
    assert decision == Decision(kind, Reason.THRESHOLD, decode=D0, prefill=P0)


def test_without_residency_the_sessions_d_holds_what_the_ledger_says() -> None:
    assert decide(turn(1000, 15), INPUTS).kind is RouteKind.LOCAL
    assert decide(turn(1000, 16), INPUTS).kind is RouteKind.PD


def test_an_evicted_history_counts_against_the_threshold() -> None:
    cluster = view(node(P0), node(D0, held_tokens=996), node(D1))  # 4 + 10 uncached
    assert decide(turn(1000, 10, cluster), INPUTS) == Decision(
        RouteKind.LOCAL, Reason.THRESHOLD, decode=D0, prefill=P0)
    cluster = view(node(P0), node(D0, held_tokens=976), node(D1))  # 24 + 10 uncached
    assert decide(turn(1000, 10, cluster), INPUTS).kind is RouteKind.PD


def test_the_queue_outweighs_a_small_prefix_share_only() -> None:
    # D0 caches 40% (2 x 0.4 = 0.8) behind the longest queue; D1 nothing, empty queue (1.0)
    cold_wins = view(node(P0), node(D0, held_tokens=400, waiting=5.0),
                     node(D1, held_tokens=0, waiting=0.0))
    assert decide(turn(1000, 0, cold_wins), INPUTS).decode == D1
    warm_wins = view(node(P0), node(D0, held_tokens=600, waiting=5.0),
                     node(D1, held_tokens=0, waiting=0.0))  # 1.2 > 1.0
    assert decide(turn(1000, 0, warm_wins), INPUTS).decode == D0


def test_equal_scores_go_to_the_pools_order() -> None:
    cluster = view(node(P0, in_flight=3), node(P1, in_flight=1), node(D0, in_flight=2),
                   node(D1, in_flight=1), home_prefill=None, home_decode=None)
    decision = decide(turn(0, 200, cluster, number=1), INPUTS)
    assert decision == Decision(RouteKind.PD, Reason.TURN1, decode=D1, prefill=P1)


def test_a_skip_on_another_d_than_the_sessions_runs_p_to_d_there() -> None:
    cluster = view(node(P0), node(D0, held_tokens=0), node(D1, held_tokens=1010))
    decision = decide(turn(1000, 10, cluster), INPUTS)
    assert decision == Decision(RouteKind.PD, Reason.THRESHOLD, decode=D1, prefill=P0)


def test_turn_one_and_a_turn_without_home_go_p_to_d_on_the_picked_nodes() -> None:
    assert decide(turn(0, 10, number=1), INPUTS).kind is RouteKind.PD
    assert decide(turn(1000, 10, can_local=False), INPUTS).reason is Reason.NO_HOME


def test_it_runs_through_the_turn_plan_with_the_view_it_asks_for() -> None:
    pool = BackendPool(clock=lambda: 0.0)
    for url in (P0, P1, D0, D1):
        pool.add(url, Role.PREFILL if "//p" in url else Role.DECODE)
    lookup = Lookup(Session("s", "opening", False, D0, P0, turns=1), True)
    cluster = view(node(P0), node(P1), node(D0, held_tokens=0), node(D1, held_tokens=2000))
    plan = plan_turn(RoutingPolicy(PolicyConfig(kind=NAME)), pool, lookup,
                     turn(2000, 30, cluster).workload, survey=lambda session: cluster)
    assert plan.decision.kind is RouteKind.PD and plan.decision.decode == D1
    assert plan.attempts[0].picks[0].prefer == D1

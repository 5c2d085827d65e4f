"""A hybrid pool (R nodes beside P and D): what each policy does with it (plan_turn)."""

from __future__ import annotations

import pytest

from proxy.backends import BackendPool
from proxy.config import Policy, PolicyConfig
from proxy.live import StepCosts
from proxy.policies import RoutingPolicy
from proxy.sessions.session import Lookup, Session
from proxy.turn_plan import plan_turn
from proxy.vocabulary import Reason, Role, RouteKind, Workload

COSTS = StepCosts(base_ms=6.0, per_prefill_token_ms=0.02, per_decode_seq_ms=0.01)
TURN1 = Workload(1, 500, 0, 100, 1.0)
TURN2 = Workload(2, 50, 600, 100, 1.0)


def hybrid_pool() -> BackendPool:
    pool = BackendPool(clock=lambda: 0.0)
    for url, role in (("http://p0", Role.PREFILL), ("http://d0", Role.DECODE),
                      ("http://r0", Role.REPLICA)):
        pool.add(url, role)
    return pool


def lookup(turn: int, decode: str | None = None, prefill: str | None = None) -> Lookup:
    return Lookup(Session("s", "opening", False, decode, prefill, turns=turn - 1), turn > 1)


def policy(config: PolicyConfig) -> RoutingPolicy:
    return RoutingPolicy(config, costs=COSTS)


@pytest.mark.parametrize("config", [PolicyConfig(kind=Policy.PD),
                                    PolicyConfig(kind=Policy.LOCAL),
                                    PolicyConfig(kind=Policy.FIXED, x=0.5),
                                    PolicyConfig(kind=Policy.THRESHOLD, non_cached_tokens=64)])
def test_disaggregated_policies_never_use_the_replicas(config: PolicyConfig) -> None:
    first = plan_turn(policy(config), hybrid_pool(), lookup(1), TURN1)
    assert (first.decision.kind, first.decision.reason) == (RouteKind.PD, Reason.TURN1)
    later = plan_turn(policy(config), hybrid_pool(), lookup(2, "http://d0", "http://p0"), TURN2)
    assert later.decision.kind in (RouteKind.PD, RouteKind.LOCAL)
    roles = {pick.role for attempt in (*first.attempts, *later.attempts) for pick in attempt.picks}
    assert Role.REPLICA not in roles


def test_policy_replica_sends_everything_to_the_replicas() -> None:
    for look, work in ((lookup(1), TURN1), (lookup(2, "http://r0"), TURN2)):
        plan = plan_turn(policy(PolicyConfig(kind=Policy.REPLICA)), hybrid_pool(), look, work)
        assert plan.decision.kind is RouteKind.REPLICA
        assert {p.role for a in plan.attempts for p in a.picks} == {Role.REPLICA}


def test_live_today_places_turn_one_on_p_to_d_only() -> None:
    plan = plan_turn(policy(PolicyConfig(kind=Policy.LIVE)), hybrid_pool(), lookup(1), TURN1)
    assert (plan.decision.kind, plan.decision.reason) == (RouteKind.PD, Reason.TURN1)

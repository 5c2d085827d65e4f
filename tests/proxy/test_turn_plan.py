"""proxy.routing.turn_plan: one turn's decision and nodes, the one function the router and the
simulator both call (patching it changes both)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from profiler.simulator.sim_proxy import SimProxy
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.cluster_view import ClusterView
from proxy.live.predict import TurnState
from proxy.policies.routing import RoutingPolicy
from proxy.routing import turn_plan
from proxy.routing.turn_plan import Attempt, Pick, TurnPlan, plan_turn
from proxy.sessions.session import Lookup, Session
from proxy.shared.vocabulary import Decision, Node, Reason, Role, RouteKind, Workload
from proxy.upstream.backends import BackendPool
from tests.proxy.router_harness import chat, router_over, text_of
from tests.proxy.test_policies import readback_table


def _pool() -> BackendPool:
    pool = BackendPool(clock=lambda: 0.0)
    for url, role in (("http://p0", Role.PREFILL), ("http://d0", Role.DECODE),
                      ("http://d1", Role.DECODE), ("http://r0", Role.REPLICA)):
        pool.add(url, role)
    return pool


def _lookup(turn: int, decode: str | None = None, prefill: str | None = None) -> Lookup:
    """A lookup of turn `turn` (> 1: a continuation of a session with turn - 1 turns)."""
    return Lookup(Session("s", "opening", False, decode, prefill, turns=turn - 1), turn > 1)


def _policy(kind: Policy) -> RoutingPolicy:
    return RoutingPolicy(PolicyConfig(kind=kind))


WORK = Workload(2, 20, 100, 10, 1.0)


def test_a_local_verdict_tries_the_sessions_d_alone_then_falls_back_to_p_to_d() -> None:
    plan = plan_turn(_policy(Policy.LOCAL), _pool(), _lookup(2, "http://d1", "http://p0"), WORK)
    assert plan.decision == Decision(RouteKind.LOCAL, Reason.POLICY)
    assert plan.attempts == (
        Attempt(RouteKind.LOCAL, (Pick(Role.DECODE, "http://d1", only_preferred=True),)),
        Attempt(RouteKind.PD, (Pick(Role.DECODE, "http://d1"), Pick(Role.PREFILL, "http://p0"))))


def test_a_forced_local_turn_without_a_usable_home_goes_p_to_d() -> None:
    pool = _pool()
    pool.mark("http://d1", healthy=False)
    plan = plan_turn(_policy(Policy.PD), pool, _lookup(2, "http://d1"), WORK, RouteKind.LOCAL)
    assert plan.decision == Decision(RouteKind.PD, Reason.NO_HOME)
    assert [a.route for a in plan.attempts] == [RouteKind.PD]


def test_a_table_with_readback_reads_back_only_where_d_keeps_the_blocks() -> None:
    # The cell of WORK (small/tiny at 1/s): readback beats pd and local at w_tpot 3.
    policy = RoutingPolicy(PolicyConfig(kind=Policy.PPD, table=Path("t.csv"), w_tpot=3.0),
                           readback_table())
    lookup = _lookup(2, "http://d1", "http://p0")
    kept = plan_turn(policy, _pool(), lookup, WORK, readback=None)
    assert kept.decision.kind is RouteKind.READBACK
    assert [a.route for a in kept.attempts] == [RouteKind.READBACK, RouteKind.PD]
    # D keeps nothing for this session (a streamed previous turn): the pd/local verdict.
    missing = plan_turn(policy, _pool(), lookup, WORK, readback=Reason.READBACK_MISSING)
    assert (missing.decision.kind, missing.decision.reason) == (RouteKind.PD, Reason.TABLE)


def test_a_forced_route_wins_over_the_policy_but_not_over_replica() -> None:
    lookup = _lookup(2, "http://d1")
    forced = plan_turn(_policy(Policy.PD), _pool(), lookup, WORK, RouteKind.LOCAL)
    assert forced.decision == Decision(RouteKind.LOCAL, Reason.FORCED)
    replica = plan_turn(_policy(Policy.REPLICA), _pool(), lookup, WORK, RouteKind.LOCAL)
    assert replica.attempts == (Attempt(RouteKind.REPLICA, (Pick(Role.REPLICA, "http://d1"),)),)


@pytest.fixture
def always_pd(monkeypatch: pytest.MonkeyPatch) -> None:
    """plan_turn replaced by one that sends every turn P->D (reason: forced)."""

    def plan(policy: RoutingPolicy, pool: BackendPool, lookup: Lookup, workload: Workload,
             forced: RouteKind | None = None,
             observe: Callable[[Session], TurnState] | None = None,
             readback: Reason | None = None,
             survey: Callable[[Session], ClusterView] | None = None) -> TurnPlan:
        session = lookup.session
        return TurnPlan(Decision(RouteKind.PD, Reason.FORCED), (Attempt(RouteKind.PD, (
            Pick(Role.DECODE, session.decode), Pick(Role.PREFILL, session.prefill))),))

    monkeypatch.setattr(turn_plan, "plan_turn", plan)


@pytest.mark.usefixtures("always_pd")
def test_the_simulator_follows_a_patched_plan_turn() -> None:
    proxy = SimProxy([Node("http://p0", Role.PREFILL), Node("http://d0", Role.DECODE)],
                     _policy(Policy.LOCAL), lambda: 0.0)
    first = proxy.begin("c1", 1, 100, 10)
    proxy.prefilled(first)
    proxy.end(first, True, 100, 10)
    second = proxy.begin("c1", 2, 20, 10)
    # The local policy would keep turn 2 on its D; the patched function says P->D.
    assert second.lookup.turn == 2
    assert (second.route, second.decision.reason) == (RouteKind.PD, Reason.FORCED)


@pytest.mark.usefixtures("always_pd")
async def test_the_router_follows_a_patched_plan_turn() -> None:
    async with router_over("p1", "d1", policy=Policy.LOCAL) as h:
        first = await h.ask(chat("Hello"))
        second, _ = await h.ask(chat("Hello", text_of(first[1]), "And then?"))
    assert (second.headers["x-ppd-route"], second.headers["x-ppd-turn"]) == ("pd", "2")
    assert len(h.cluster["p1"].received) == 2

"""proxy.routing.turn_plan: one turn's decision and nodes, the one function the router and the
simulator both call (patching it changes both)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

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
from tests.proxy.policies.test_policies import readback_table
from tests.proxy.router_harness import chat, router_over, text_of


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


class _Naming:
    """A policy that decides local on a named D whatever the turn (`places`: as live)."""

    def __init__(self, places: bool) -> None:
        self.spec = SimpleNamespace(places=places, ignores_forcing=False,
                                    needs=SimpleNamespace(view=False))

    def decide(self, workload: Workload, session_id: str, can_local: bool,
               state: TurnState | None = None, **_: object) -> Decision:
        return Decision(RouteKind.LOCAL, Reason.TURN1, decode="http://d1")


def test_a_placing_policy_serves_a_first_turn_whole_on_the_d_it_names() -> None:
    first = Workload(1, 500, 0, 10, 1.0)
    plan = plan_turn(_Naming(places=True), _pool(), _lookup(1), first)  # type: ignore[arg-type]
    assert plan.attempts == (
        Attempt(RouteKind.LOCAL, (Pick(Role.DECODE, "http://d1", only_preferred=True),)),
        Attempt(RouteKind.PD, (Pick(Role.DECODE, "http://d1"), Pick(Role.PREFILL, None))))


def test_any_other_policys_local_first_turn_still_goes_p_to_d() -> None:
    first = Workload(1, 500, 0, 10, 1.0)
    plan = plan_turn(_Naming(places=False), _pool(), _lookup(1), first)  # type: ignore[arg-type]
    assert [a.route for a in plan.attempts] == [RouteKind.PD]


def test_a_first_turn_named_to_an_unusable_d_goes_p_to_d() -> None:
    pool = _pool()
    pool.mark("http://d1", healthy=False)
    first = Workload(1, 500, 0, 10, 1.0)
    plan = plan_turn(_Naming(places=True), pool, _lookup(1), first)  # type: ignore[arg-type]
    assert plan.decision.reason is Reason.NODE_UNUSABLE
    assert [a.route for a in plan.attempts] == [RouteKind.PD]


@pytest.fixture
def first_turn_local(monkeypatch: pytest.MonkeyPatch) -> None:
    """plan_turn replaced by one that serves a turn 1 whole on d2 and a turn 2 on its D."""

    def plan(policy: RoutingPolicy, pool: BackendPool, lookup: Lookup, workload: Workload,
             forced: RouteKind | None = None, observe: object = None, readback: object = None,
             survey: object = None) -> TurnPlan:
        named = lookup.session.decode if lookup.continuation else pool.nodes(Role.DECODE)[1].url
        return TurnPlan(Decision(RouteKind.LOCAL, Reason.TURN1, decode=named),
                        (Attempt(RouteKind.LOCAL, (Pick(Role.DECODE, named, True),)),))

    monkeypatch.setattr(turn_plan, "plan_turn", plan)


@pytest.mark.usefixtures("first_turn_local")
async def test_the_router_serves_a_first_turn_on_a_d_and_keeps_it_as_the_sessions() -> None:
    async with router_over("p1", "d1", "d2") as h:
        first = await h.ask(chat("Hello"))
        second, _ = await h.ask(chat("Hello", text_of(first[1]), "And then?"))
    assert first[0].headers["x-ppd-route"] == "local"
    assert second.headers["x-ppd-turn"] == "2"  # the session was filed on d2
    assert len(h.cluster["d2"].received) == 2 and not h.cluster["d1"].received
    assert not h.cluster["p1"].received

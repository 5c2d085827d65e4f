"""Policies that name nodes (`Decision.decode` / `prefill`) and read `Turn.view`:
`proxy.routing.turn_plan.plan_turn` puts a named node first, drops one that is not usable (reason
node_unusable), keeps a local turn on the session's D, and builds the view only for a policy
that declares `Needs(view=True)`."""

from __future__ import annotations

from dataclasses import replace

from proxy.config.policy_config import Policy, PolicyConfig
from proxy.live.cluster_view import ClusterView, NodeView
from proxy.policies.base import Inputs, Needs, Turn
from proxy.policies.routing import RoutingPolicy
from proxy.routing.turn_plan import Attempt, Pick, plan_turn
from proxy.sessions.session import Lookup, Session
from proxy.shared.vocabulary import Decision, Reason, Role, RouteKind, Workload
from proxy.upstream.backends import BackendPool

WORK = Workload(2, 20, 100, 10, 1.0)
HOME = Lookup(Session("s", "opening", False, "http://d0", "http://p0", turns=1), True)


def _pool() -> BackendPool:
    pool = BackendPool(clock=lambda: 0.0)
    for url, role in (("http://p0", Role.PREFILL), ("http://p1", Role.PREFILL),
                      ("http://d0", Role.DECODE), ("http://d1", Role.DECODE)):
        pool.add(url, role)
    return pool


def _naming(decision: Decision, needs: Needs | None = None,
            seen: list[Turn] | None = None) -> RoutingPolicy:
    """The pd policy with its decide replaced by one that answers `decision`."""
    policy = RoutingPolicy(PolicyConfig(kind=Policy.PD))

    def decide(turn: Turn, inputs: Inputs) -> Decision:
        if seen is not None:
            seen.append(turn)
        return decision

    policy.spec = replace(policy.spec, decide=decide, needs=needs or Needs())
    return policy


def test_named_nodes_come_before_the_sessions_own() -> None:
    decision = Decision(RouteKind.PD, Reason.POLICY, decode="http://d1", prefill="http://p1")
    plan = plan_turn(_naming(decision), _pool(), HOME, WORK)
    assert plan.decision == decision
    assert plan.attempts == (Attempt(RouteKind.PD, (Pick(Role.DECODE, "http://d1"),
                                                    Pick(Role.PREFILL, "http://p1"))),)


def test_an_unusable_named_node_gives_way_to_the_default_pick_and_says_so() -> None:
    pool = _pool()
    pool.mark("http://d1", healthy=False)
    for named in ("http://d1", "http://nowhere", "http://p1"):  # down, unknown, a P as D
        plan = plan_turn(_naming(Decision(RouteKind.PD, Reason.POLICY, decode=named,
                                          prefill="http://p1")), pool, HOME, WORK)
        assert plan.decision == Decision(RouteKind.PD, Reason.NODE_UNUSABLE,
                                         prefill="http://p1")
        assert plan.attempts[0].picks == (Pick(Role.DECODE, "http://d0"),
                                          Pick(Role.PREFILL, "http://p1"))


def test_a_local_turn_stays_on_the_sessions_d_and_its_fallback_takes_the_name() -> None:
    decision = Decision(RouteKind.LOCAL, Reason.POLICY, decode="http://d1")
    plan = plan_turn(_naming(decision), _pool(), HOME, WORK)
    assert plan.attempts == (
        Attempt(RouteKind.LOCAL, (Pick(Role.DECODE, "http://d0", only_preferred=True),)),
        Attempt(RouteKind.PD, (Pick(Role.DECODE, "http://d1"), Pick(Role.PREFILL, "http://p0"))))


def test_the_view_is_built_for_a_policy_that_needs_it_only() -> None:
    view = ClusterView((NodeView("http://d1", Role.DECODE, in_flight=2),), "http://p0",
                       "http://d0")
    calls: list[str] = []

    def survey(session: Session) -> ClusterView:
        calls.append(session.id)
        return view

    blind: list[Turn] = []
    plan_turn(_naming(Decision(RouteKind.PD, Reason.POLICY), seen=blind), _pool(), HOME, WORK,
              survey=survey)
    assert calls == [] and blind[0].view is None
    seeing: list[Turn] = []
    plan_turn(_naming(Decision(RouteKind.PD, Reason.POLICY), Needs(view=True), seeing),
              _pool(), HOME, WORK, survey=survey)
    assert calls == ["s"] and seeing[0].view is view


def test_a_node_views_busy_is_the_gauge_else_the_proxys_own_count() -> None:
    assert NodeView("u", Role.DECODE, in_flight=3).busy == 3.0
    assert NodeView("u", Role.DECODE, in_flight=3, running=7.0).busy == 7.0
    assert NodeView("u", Role.DECODE, kv_blocks=10, kv_block_size=16).kv_tokens == 160
    assert NodeView("u", Role.DECODE, kv_blocks=10).kv_tokens is None

"""proxy.routing.turn_machine: one turn's walk through its plan - attempts, readback fallbacks, the
keep-blocks rule, node taking, the session's home - written once for the router and the
simulator (which import these rules rather than restate them)."""

from __future__ import annotations

import re
from array import array
from pathlib import Path

from proxy.readback.protocol import MIN_READBACK_TOKENS, HeldKV
from proxy.routing.turn_machine import Leg, TurnMachine, keeps_blocks, read_back_tokens, take
from proxy.routing.turn_plan import Attempt, Pick, TurnPlan
from proxy.sessions.session import Session
from proxy.shared.vocabulary import Decision, Reason, Role, RouteKind
from proxy.upstream.backends import BackendPool

ROOT = Path(__file__).resolve().parents[3]
HELD = HeldKV({}, "http://d0", array("q", range(200)), 100.0)
READBACK_PLAN = TurnPlan(Decision(RouteKind.READBACK, Reason.LIVE), (
    Attempt(RouteKind.READBACK, (Pick(Role.DECODE, "http://d0"), Pick(Role.PREFILL, None))),
    Attempt(RouteKind.PD, (Pick(Role.DECODE, "http://d0"), Pick(Role.PREFILL, None)))))


def _pool() -> BackendPool:
    pool = BackendPool(clock=lambda: 0.0)
    for url, role in (("http://p0", Role.PREFILL), ("http://d0", Role.DECODE),
                      ("http://d1", Role.DECODE)):
        pool.add(url, role)
    return pool


def _machine(plan: TurnPlan = READBACK_PLAN, offered: bool = True,
             reads_back: bool = True) -> TurnMachine:
    return TurnMachine(plan, Session("s", "o", False, "http://d0", "http://p0", 1), offered,
                       reads_back)


def test_d_keeps_blocks_only_where_a_readback_can_use_them() -> None:
    for route in (RouteKind.PD, RouteKind.READBACK, RouteKind.LOCAL):
        assert keeps_blocks(route, offered=True, reads_back=True)
        assert keeps_blocks(route, offered=True, reads_back=True, body={"messages": []})
        assert not keeps_blocks(route, offered=False, reads_back=True)
    assert not keeps_blocks(RouteKind.REPLICA, offered=True, reads_back=True)
    # vLLM names the blocks in a whole answer of one sequence whose ids the proxy asked for.
    for body in ({"stream": True}, {"n": 2}, {"return_token_ids": True}):
        assert not keeps_blocks(RouteKind.PD, offered=True, reads_back=True, body=body)


def test_d_keeps_nothing_for_a_policy_that_never_reads_back() -> None:
    # Offered by the nodes, but pd/local never read kept blocks back: pinning them for the
    # TTL would only fill D's KV (docs/production-traces.md, "With readback on").
    for route in RouteKind:
        assert not keeps_blocks(route, offered=True, reads_back=False)
        assert not keeps_blocks(route, offered=True, reads_back=False, body={"messages": []})


def test_a_forced_readback_under_a_policy_that_never_reads_back_keeps_nothing() -> None:
    # The route is forced (x-ppd-route: readback): the book has nothing for it (readback_missing)
    # and the P->D that serves it keeps nothing either.
    machine = _machine(reads_back=False)
    machine.next_attempt()
    assert not machine.keeps()
    assert not machine.kept(Reason.READBACK_MISSING)
    machine.next_attempt()
    assert machine.route is RouteKind.PD and not machine.keeps()
    assert machine.decision() == Decision(RouteKind.PD, Reason.READBACK_MISSING)


def test_a_readback_reads_the_common_prefix_only_when_it_is_long_enough() -> None:
    held = list(range(200))
    assert read_back_tokens(held, [*range(150), 999, 1000]) == 150
    assert read_back_tokens(held, [*range(MIN_READBACK_TOKENS - 1), 999]) is None
    assert read_back_tokens(held, None) is None  # P gave no ids


def test_taking_a_node_limited_to_the_home_takes_it_or_nothing() -> None:
    pool = _pool()
    assert take(pool, Pick(Role.DECODE, "http://d1", only_preferred=True)).url == "http://d1"
    pool.mark("http://d1", healthy=False)
    assert take(pool, Pick(Role.DECODE, "http://d1", only_preferred=True)) is None
    assert take(pool, Pick(Role.DECODE, None, only_preferred=True)) is None
    assert take(pool, Pick(Role.DECODE, "http://d1")).url == "http://d0"  # else the least busy
    assert take(pool, Pick(Role.DECODE, None), exclude=frozenset({"http://d0"})) is None


def test_a_readback_without_kept_blocks_runs_the_plans_p_to_d_and_says_why() -> None:
    machine = _machine()
    first = machine.next_attempt()
    assert first is not None and machine.legs() == (Leg.TOKENIZE, Leg.PREFILL, Leg.ANSWER)
    assert not machine.kept(Reason.READBACK_EXPIRED)
    second = machine.next_attempt()
    assert second is not None and second.route is RouteKind.PD and machine.last
    assert machine.legs() == (Leg.PREFILL, Leg.ANSWER)
    assert machine.decision() == Decision(RouteKind.PD, Reason.READBACK_EXPIRED)
    assert machine.next_attempt() is None


def test_a_readback_whose_tokens_do_not_match_goes_p_to_d_once() -> None:
    machine = _machine()
    machine.next_attempt()
    assert machine.kept(HELD)
    held = machine.take_held()
    assert held is HELD and machine.take_held() is None  # a retry on another P is plain P->D
    assert machine.tokenized(held, [7] * 100) is None
    assert machine.route is RouteKind.PD and machine.read_back == 0
    assert machine.decision() == Decision(RouteKind.PD, Reason.READBACK_MISMATCH)


def test_a_readback_that_matches_reads_and_keeps_its_decision() -> None:
    machine = _machine()
    machine.next_attempt()
    machine.kept(HELD)
    assert machine.tokenized(HELD, list(range(120))) == 119  # P computes the last token
    assert (machine.route, machine.read_back) == (RouteKind.READBACK, 119)
    assert machine.decision() == READBACK_PLAN.decision
    assert machine.keeps() and not _machine(offered=False).keeps()


def test_a_readback_attempt_without_nodes_falls_back_with_no_home() -> None:
    machine = _machine()
    machine.next_attempt()
    machine.kept(HELD)
    machine.unserved()
    machine.next_attempt()
    assert machine.take_held() is None
    assert machine.decision() == Decision(RouteKind.PD, Reason.NO_HOME)


def test_the_nodes_that_serve_become_the_sessions_home() -> None:
    machine = _machine()
    machine.served("http://d1", "http://p1")
    assert (machine.session.decode, machine.session.prefill) == ("http://d1", "http://p1")
    machine.served("http://d0")  # a local or replica turn: P stays
    assert (machine.session.decode, machine.session.prefill) == ("http://d0", "http://p1")


def test_the_router_and_the_simulator_restate_none_of_these_rules() -> None:
    """The mismatch threshold, the routes that keep blocks and the only-the-home pick are
    the machine's: neither the router nor the simulator names them."""
    rules = re.compile(r"MIN_READBACK_TOKENS|matched_tokens\(|pool\.take\(|"
                       r"RouteKind\.PD, RouteKind\.READBACK, RouteKind\.LOCAL")
    for path in ("proxy/routing/router.py", "profiler/simulator/sim_proxy.py",
                 "profiler/simulator/virtual_cluster.py"):
        assert not rules.search((ROOT / path).read_text()), path


def test_d_pins_every_d_leg_on_nodes_that_offer_readback_but_a_local_leg_only_when_asked() -> None:
    # vLLM's request_finished: a D leg carrying kv_transfer_params keeps its blocks, and a
    # P->D D leg carries P's whatever the policy; a local leg carries them only if asked.
    pd_plan = TurnPlan(Decision(RouteKind.PD, Reason.FORCED), (
        Attempt(RouteKind.PD, (Pick(Role.DECODE, "http://d0"), Pick(Role.PREFILL, None))),))
    local_plan = TurnPlan(Decision(RouteKind.LOCAL, Reason.FORCED), (
        Attempt(RouteKind.LOCAL, (Pick(Role.DECODE, "http://d0", only_preferred=True),)),))
    for reads_back in (True, False):
        machine = _machine(pd_plan, reads_back=reads_back)
        machine.next_attempt()
        assert machine.pins() and machine.keeps() is reads_back
        local = _machine(local_plan, reads_back=reads_back)
        local.next_attempt()
        assert local.pins() is reads_back and local.keeps() is reads_back
    off = _machine(pd_plan, offered=False)
    off.next_attempt()
    assert not off.pins() and not off.keeps()

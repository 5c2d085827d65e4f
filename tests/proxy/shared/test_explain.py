"""proxy.shared.explain: which turns fell back and why, and the costs header's text."""

from __future__ import annotations

import pytest

from proxy.shared.explain import (
    Fallback,
    costs_text,
    decision_headers,
    fallback,
    parse_costs,
)
from proxy.shared.vocabulary import Decision, Reason, RouteCost, RouteKind

PD, LOCAL, READBACK, REPLICA = RouteKind.PD, RouteKind.LOCAL, RouteKind.READBACK, RouteKind.REPLICA


@pytest.mark.parametrize(("decision", "served", "forced", "expected"), [
    # Served as decided or forced: nothing fell back.
    (Decision(PD, Reason.TURN1), PD, None, None),
    (Decision(LOCAL, Reason.LIVE), LOCAL, None, None),
    (Decision(READBACK, Reason.FORCED), READBACK, READBACK, None),
    (Decision(PD, Reason.FORCED), PD, PD, None),
    # A readback with no blocks to read: P->D, its reason says why (decided or forced).
    (Decision(PD, Reason.READBACK_MISSING), PD, READBACK,
     Fallback(READBACK, Reason.READBACK_MISSING)),
    (Decision(PD, Reason.READBACK_EXPIRED), PD, None, Fallback(READBACK, Reason.READBACK_EXPIRED)),
    (Decision(PD, Reason.READBACK_MISMATCH), PD, None,
     Fallback(READBACK, Reason.READBACK_MISMATCH)),
    # Forced onto a route the turn has no home for (turn 1).
    (Decision(PD, Reason.NO_HOME), PD, LOCAL, Fallback(LOCAL, Reason.NO_HOME)),
    (Decision(PD, Reason.NO_HOME), PD, READBACK, Fallback(READBACK, Reason.NO_HOME)),
    # A policy without forcing on a turn without a home decided P->D itself: no fallback.
    (Decision(PD, Reason.NO_HOME), PD, None, None),
    # Decided local (or a replica home), but the session's node could not take it.
    (Decision(LOCAL, Reason.LIVE), PD, None, Fallback(LOCAL, Reason.NO_HOME)),
    (Decision(REPLICA, Reason.REPLICA_HOME), PD, None, Fallback(REPLICA, Reason.NO_HOME)),
    # The node the policy named was not usable: the default pick served the same route.
    (Decision(PD, Reason.NODE_UNUSABLE), PD, None, Fallback(PD, Reason.NODE_UNUSABLE)),
])
def test_a_fallback_is_a_route_decided_or_forced_that_did_not_serve(
        decision: Decision, served: RouteKind, forced: RouteKind | None,
        expected: Fallback | None) -> None:
    assert fallback(decision, served, forced) == expected


def test_costs_text_lists_each_route_weighed_in_ms_and_reads_back() -> None:
    costs = (RouteCost(PD, 412.04, 30.06), RouteCost(LOCAL, 96.26), RouteCost(READBACK, 150.0))
    text = costs_text(costs)
    assert text == "pd=ttft:412.0,tpot:30.1;local=ttft:96.3;readback=ttft:150.0"
    assert parse_costs(text) == {"pd": {"ttft": 412.0, "tpot": 30.1},
                                 "local": {"ttft": 96.3}, "readback": {"ttft": 150.0}}
    assert costs_text(()) is None


def test_headers_name_the_reason_always_and_the_rest_when_known() -> None:
    plain = decision_headers(Decision(PD, Reason.TURN1), None)
    assert plain == {"x-ppd-reason": "turn1"}
    weighed = Decision(PD, Reason.READBACK_EXPIRED, costs=(RouteCost(PD, 10.0),))
    assert decision_headers(weighed, Fallback(READBACK, Reason.READBACK_EXPIRED)) == {
        "x-ppd-reason": "readback_expired", "x-ppd-fallback": "readback_expired",
        "x-ppd-costs": "pd=ttft:10.0"}


def test_costs_are_an_explanation_not_part_of_the_verdict() -> None:
    assert Decision(LOCAL, Reason.LIVE, costs=(RouteCost(PD, 1.0),)) == Decision(
        LOCAL, Reason.LIVE)

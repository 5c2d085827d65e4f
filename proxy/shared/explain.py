"""What a reply says about its routing decision: the x-ppd-reason, x-ppd-fallback and
x-ppd-costs headers, and the same on the access line (`proxy.observability.logs.AccessEntry`).

- `x-ppd-reason`: the decision's reason as the metrics count it (`proxy.shared.vocabulary.Reason`:
  turn1, live, evicted, table, forced, readback_missing, ...). Every routed reply has it.
- `x-ppd-fallback`: only when the route decided or forced for the turn is not the one that
  served it; the value says why (`Fallback`): readback_missing / readback_expired /
  readback_mismatch (no blocks to read back: P->D instead), no_home (nothing to append to or
  read back, or the session's node could not take the turn), node_unusable (the node the
  policy named was not usable: the default pick served).
- `x-ppd-costs`: what the policy weighed (live's predictions, ppd's table row), per route,
  in ms: `pd=ttft:412.0,tpot:30.1;local=ttft:96.3`. Sent only to a request that carries
  the admin key (`proxy.serving.endpoints` drops it otherwise): the costs describe the cluster's
  state, which is the operator's business, not every client's.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.shared.routes import ROUTES
from proxy.shared.vocabulary import Decision, Reason, RouteCost, RouteKind

REASON_HEADER = "x-ppd-reason"
FALLBACK_HEADER = "x-ppd-fallback"
COSTS_HEADER = "x-ppd-costs"

# Reasons that themselves say a route fell back to P->D (readback's: no blocks to read).
_FALLBACK_REASONS = {reason: spec.kind for spec in ROUTES.values()
                     for reason in spec.fallback_reasons}


@dataclass(frozen=True, slots=True)
class Fallback:
    """The route decided or forced for a turn (`wanted`) that did not serve it, and why."""

    wanted: RouteKind
    reason: Reason


def fallback(decision: Decision, served: RouteKind,
             forced: RouteKind | None = None) -> Fallback | None:
    """Why the turn was not served by the route decided (`decision`, as the router records
    it) or forced (`forced`: the x-ppd-route header, when the policy honours it); None when
    it was."""
    wanted = _FALLBACK_REASONS.get(decision.reason)
    if wanted is not None:  # readback decided or forced, no blocks to read: P->D
        return Fallback(wanted, decision.reason)
    wanted = forced or decision.kind
    if wanted is not served:
        # Forced onto a route that needs a home the turn lacks (reason no_home), or the
        # session's node could not take it (busy, down, failed before its first byte).
        return Fallback(wanted, Reason.NO_HOME)
    if decision.reason is Reason.NODE_UNUSABLE:
        return Fallback(wanted, Reason.NODE_UNUSABLE)
    return None


def costs_text(costs: tuple[RouteCost, ...]) -> str | None:
    """`pd=ttft:412.0,tpot:30.1;local=ttft:96.3` (ms); None when nothing was weighed."""
    if not costs:
        return None
    parts = []
    for cost in costs:
        text = f"{cost.route.value}=ttft:{cost.ttft_ms:.1f}"
        if cost.tpot_ms is not None:
            text += f",tpot:{cost.tpot_ms:.1f}"
        parts.append(text)
    return ";".join(parts)


def parse_costs(text: str) -> dict[str, dict[str, float]]:
    """`costs_text` back to {route: {"ttft": ms, "tpot": ms}} (clients, tests)."""
    parsed: dict[str, dict[str, float]] = {}
    for part in text.split(";"):
        route, _, values = part.partition("=")
        parsed[route] = {key: float(value) for key, _, value in
                         (item.partition(":") for item in values.split(","))}
    return parsed


def decision_headers(decision: Decision, fell_back: Fallback | None) -> dict[str, str]:
    """The reason, fallback and costs headers of a reply (the costs for admins only:
    `proxy.serving.endpoints` removes them from the others' replies)."""
    headers: dict[str, str] = {REASON_HEADER: decision.reason}  # StrEnums: their values
    if fell_back is not None:
        headers[FALLBACK_HEADER] = fell_back.reason
    costs = costs_text(decision.costs)
    if costs is not None:
        headers[COSTS_HEADER] = costs
    return headers

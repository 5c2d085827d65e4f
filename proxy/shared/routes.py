"""Every route a turn can take, declared once (`ROUTES`): the roles of the nodes it uses,
the answering node first; whether it needs the session's D, runs only on the session's own
node, and what it falls back to when that node cannot take the turn; whether an operator
may force it with the `x-ppd-route` header; the reasons a turn decided for it names when
it was served by its fallback instead. `proxy.routing.turn_plan` builds a turn's attempts from these
declarations, `proxy.serving.endpoints` the forcible values and `proxy.observability.metrics` its
route labels and
fallback counts; the legs each route runs are `proxy.routing.router`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.shared.vocabulary import Reason, Role, RouteKind


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """How one route is served (see the module docstring)."""

    kind: RouteKind
    roles: tuple[Role, ...]  # the nodes it picks, the one whose reply the client gets first
    needs_home: bool = False  # only a turn whose session's D is usable can take it
    home_only: bool = False  # only the session's node; else `fallback`
    fallback: RouteKind | None = None  # tried next, and taken when there is no home
    forcible: bool = False
    # Why a turn decided for this route went to `fallback` instead (a metrics label each).
    fallback_reasons: tuple[Reason, ...] = ()


ROUTES: dict[RouteKind, RouteSpec] = {spec.kind: spec for spec in (
    # P prefills, ships the KV to D, D decodes (x=0); D is picked first.
    RouteSpec(RouteKind.PD, (Role.DECODE, Role.PREFILL), forcible=True),
    # Append-prefill on the session's D, which holds the history (x=1).
    RouteSpec(RouteKind.LOCAL, (Role.DECODE,), needs_home=True, home_only=True,
              fallback=RouteKind.PD, forcible=True),
    # P reads the history's KV back from the session's D, computes the rest, and hands the
    # turn to a D (the session's, whose prefix cache holds the history): P->D's picks.
    RouteSpec(RouteKind.READBACK, (Role.DECODE, Role.PREFILL), needs_home=True,
              fallback=RouteKind.PD, forcible=True,
              fallback_reasons=(Reason.READBACK_MISSING, Reason.READBACK_EXPIRED,
                                Reason.READBACK_MISMATCH, Reason.READBACK_DECLINED)),
    # One node does prefill and decode.
    RouteSpec(RouteKind.REPLICA, (Role.REPLICA,)),
)}

# The x-ppd-route header's values.
FORCIBLE: dict[str, RouteKind] = {kind.value: kind for kind, spec in ROUTES.items()
                                  if spec.forcible}

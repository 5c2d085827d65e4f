"""One turn's decision, in one pure function: the route and the nodes that serve it.

`plan_turn` is everything the proxy decides about a turn before a byte goes upstream: the
forced route (the x-ppd-route header, or the profiler's forcing), whether the turn can run on
the session's own D (`can_local`), the policy's verdict, and which nodes serve it, in the order
they are tried. It reads the pool and does no I/O and no bookkeeping, so
`proxy.routing.router.Router`
(async HTTP) and the simulator's `SimProxy` (virtual time) call the same code and differ only
in how they run the legs. Both call it as `turn_plan.plan_turn`, so a test that patches it
sees both change.

Node order (docs/architecture.md, "Request flow"): a replica turn goes to the session's
replica first, else the least busy one; a local turn goes to the session's D only, and when
that D cannot take it now the turn falls back to P->D; a P->D turn picks its D first (the
session's, else the least busy), then its P (the session's, else the least busy).
In a hybrid pool under a policy that places (live), a conversation it placed on a replica
goes back to that replica alone, falling back to P->D when it cannot take the turn (as a
local turn does); one placed there anew goes to the least busy replica. Live is told
whether P->D can run at all (a usable P and D), so with every P or every D down it serves
from replicas and Ds alone.
A policy may name the nodes itself (`Decision.decode`, `Decision.prefill`): a named node
takes the session's place as the first choice, with the same fallbacks; a named node that is
not usable is dropped (reason NODE_UNUSABLE). A local turn runs on the session's D whatever
is named (the name applies to its P->D fallback). A turn without a usable home (turn 1, or
its D gone) that a placing policy (live) decides local on a D it names is served whole there
- plain, non-disaggregated serving: vLLM's D (NIXL, kv_role kv_both) prefills a request that
brings no KV itself - with P->D as its fallback; it becomes the session's D.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from proxy.live.cluster_view import ClusterView
from proxy.live.predict import TurnState
from proxy.policies.routing import RoutingPolicy
from proxy.sessions.session import Lookup, Session
from proxy.shared.routes import ROUTES
from proxy.shared.vocabulary import Decision, Reason, Role, RouteKind, Workload
from proxy.upstream.backends import BackendPool


@dataclass(frozen=True, slots=True)
class Pick:
    """One node to choose: of `role`, `prefer` first (the session's node), else the least
    loaded usable one; with `only_preferred`, `prefer` or nothing (the local route)."""

    role: Role
    prefer: str | None
    only_preferred: bool = False


@dataclass(frozen=True, slots=True)
class Attempt:
    """One way to serve the turn: its route and its picks, the answering node first."""

    route: RouteKind
    picks: tuple[Pick, ...]

    @property
    def answering(self) -> Pick:
        """The node whose reply the client gets (D, the session's D, or R)."""
        return self.picks[0]

    @property
    def prefill(self) -> Pick | None:
        """P's pick on a P->D attempt."""
        return self.picks[1] if len(self.picks) > 1 else None


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """The policy's verdict and the attempts that serve it, in order (the last is the
    fallback when an earlier one finds no node)."""

    decision: Decision
    attempts: tuple[Attempt, ...]


def plan_turn(policy: RoutingPolicy, pool: BackendPool, lookup: Lookup, workload: Workload,
              forced: RouteKind | None = None,
              observe: Callable[[Session], TurnState] | None = None,
              readback: Reason | None = Reason.READBACK_MISSING,
              survey: Callable[[Session], ClusterView] | None = None) -> TurnPlan:
    """The decision of one turn and the nodes that serve it, in the order they are tried
    (`observe`: the cluster now, which policy live reads - `proxy.live.view.LiveView.state` in
    the proxy, the engines' state in the simulator; read only for a turn that could run locally;
    `readback`: None when the session's D keeps blocks P can read back now, else why not;
    `survey`: every usable node now, `Turn.view` - built only for a policy that needs it)."""
    session = lookup.session
    can_local = lookup.continuation and pool.is_usable(session.decode, Role.DECODE)
    replica_home = lookup.continuation and pool.is_usable(session.decode, Role.REPLICA)
    places = policy.spec.places
    if forced is None or policy.spec.ignores_forcing:
        # A placing policy (live) places a homeless conversation when the pool has a replica.
        placing = (places and not can_local and not replica_home
                   and pool.candidate(Role.REPLICA) is not None)
        state = observe(session) if observe is not None and (can_local or placing) else None
        if state is not None and can_local and readback is None:
            state = replace(state, readback=True)  # live prices the readback too
        can_pd = not places or (
            pool.candidate(Role.DECODE) is not None and pool.candidate(Role.PREFILL) is not None)
        view = survey(session) if survey is not None and policy.spec.needs.view else None
        decision = policy.decide(workload, session.id, can_local, state,
                                 replica_home=replica_home, can_pd=can_pd,
                                 can_readback=can_local and readback is None, view=view)
        if decision.decode is not None or decision.prefill is not None:
            decision = _usable_names(pool, decision)
    elif ROUTES[forced].needs_home and not can_local:
        # Nothing to append to or read back (turn 1, or the session's D is gone): P->D.
        decision = Decision(ROUTES[forced].fallback or RouteKind.PD, Reason.NO_HOME)
    else:
        decision = Decision(forced, Reason.FORCED)
    if decision.kind is RouteKind.READBACK and readback is not None:
        # no blocks to read: P->D says why (on the nodes the policy named, if any)
        decision = replace(decision, kind=RouteKind.PD, reason=readback)
    if decision.reason is Reason.REPLICA_HOME:
        home = _attempt(RouteKind.REPLICA, session, decision, home_only=True)
        return TurnPlan(decision, (home, _attempt(RouteKind.PD, session, decision)))
    attempts: list[Attempt] = []
    kind: RouteKind | None = decision.kind
    if _placed_on_decode(decision, places, can_local):
        # A placing policy (live) serves a conversation without a home whole on the D it
        # named (plain serving: D prefills the prompt itself), P->D when that D cannot take it.
        attempts.append(Attempt(RouteKind.LOCAL,
                                (Pick(Role.DECODE, decision.decode, only_preferred=True),)))
        kind = ROUTES[RouteKind.LOCAL].fallback
    while kind is not None:
        route = ROUTES[kind]
        if not (route.home_only and _home(session, route.roles[0]) is None):
            attempts.append(_attempt(kind, session, decision))
        kind = route.fallback
    return TurnPlan(decision, tuple(attempts))


def _placed_on_decode(decision: Decision, places: bool, can_local: bool) -> bool:
    """A local decision for a turn without a usable home, on a D the policy named: taken
    from a policy that places (live), which prices it; any other policy's local decision
    without a home runs P->D, as before."""
    return (places and not can_local and decision.kind is RouteKind.LOCAL
            and decision.decode is not None)


def _usable_names(pool: BackendPool, decision: Decision) -> Decision:
    """The decision with the nodes it names that are not usable now taken out (the default
    pick serves instead, and the reason says so)."""
    answering = ROUTES[decision.kind].roles[0]
    decode, prefill = decision.decode, decision.prefill
    if decode is not None and not pool.is_usable(decode, answering):
        decode = None
    if prefill is not None and not pool.is_usable(prefill, Role.PREFILL):
        prefill = None
    if (decode, prefill) == (decision.decode, decision.prefill):
        return decision
    return replace(decision, reason=Reason.NODE_UNUSABLE, decode=decode, prefill=prefill)


def _home(session: Session, role: Role) -> str | None:
    """The session's node of a role (its D, or its replica, is `session.decode`)."""
    return session.prefill if role is Role.PREFILL else session.decode


def _named(decision: Decision, role: Role) -> str | None:
    """The node the policy named for a role (`Decision.decode` is the answering node's)."""
    return decision.prefill if role is Role.PREFILL else decision.decode


def _attempt(kind: RouteKind, session: Session, decision: Decision,
             home_only: bool | None = None) -> Attempt:
    """One route's picks as `proxy.shared.routes` declares them: the node the policy named, else
    the session's; a route that runs on the session's node alone (local) takes no names."""
    route = ROUTES[kind]
    only = route.home_only if home_only is None else home_only
    if only or (decision.decode is None and decision.prefill is None):
        return Attempt(kind, tuple(Pick(role, _home(session, role), only)
                                   for role in route.roles))
    return Attempt(kind, tuple(Pick(role, _named(decision, role) or _home(session, role))
                               for role in route.roles))

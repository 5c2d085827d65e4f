"""The proxy's routing on a virtual clock: its own pool, ledger, policy and load meter.

`SimProxy` does what `proxy.router.Router` does for one turn, minus HTTP: the session ledger
(`proxy.sessions`) finds the conversation and whether this turn continues it, the load meter
(`proxy.load`) measures turns per second, the configured `proxy.policies.RoutingPolicy`
decides the route (ppd reads its `proxy.table.DecisionTable` through `proxy.discretize`), and
the backend pool (`proxy.backends`) picks nodes - the session's own first, else the least
loaded - with in-flight slots held through `proxy.lease` exactly as the router holds them.
Nothing here decides a route or picks a node by itself; only the order of those calls
mirrors `Router._handle`/`_serve` (which cannot run in virtual time: it is async HTTP).

Transcripts are chat messages with placeholder text (`conv/turn/user`, `conv/turn/reply`):
the ledger's continuation rule (a request must strictly extend what D holds) sees the same
message structure as a real chat replay, so a turn after a failed one is a new branch here too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.backends import Backend, BackendPool
from proxy.completion import assistant_message
from proxy.lease import Admission, Lease
from proxy.live import TurnState
from proxy.load import RateMeter
from proxy.policies import Decision, Reason, RoutingPolicy
from proxy.route import Role, RouteKind, Workload
from proxy.session_ledger import SessionLedger
from proxy.sessions import Lookup, Session, Transcript

# The proxy's defaults (proxy.config.ProxyConfig): load window and session bounds.
DEFAULT_LOAD_WINDOW_S = 30.0
_SESSION_TTL_S = 3600.0
_MAX_SESSIONS = 100_000


@dataclass(slots=True)
class Plan:
    """One turn's route and nodes, and what the ledger needs when the turn ends."""

    route: RouteKind
    decision: Decision
    decode: Backend  # the node that answers (D, the local D, or R)
    prefill: Backend | None  # P on a P->D turn
    workload: Workload
    lookup: Lookup
    transcript: Transcript
    lease: Lease

    @property
    def session_id(self) -> str:
        return self.lookup.session.id

    @property
    def cached_tokens(self) -> int:
        """Tokens the proxy believes the answering node holds (0 unless a continuation)."""
        return self.lookup.cached_tokens


def chat_messages(conversation_id: str, turn: int) -> list[dict[str, Any]]:
    """The messages a chat replay sends with turn `turn` (placeholder texts)."""
    messages: list[dict[str, Any]] = []
    for k in range(1, turn):
        messages.append({"role": "user", "content": f"{conversation_id}/{k}/user"})
        messages.append(assistant_message(reply_text(conversation_id, k)))
    messages.append({"role": "user", "content": f"{conversation_id}/{turn}/user"})
    return messages


def reply_text(conversation_id: str, turn: int) -> str:
    return f"{conversation_id}/{turn}/reply"


class SimProxy:
    """The proxy's routing state, driven by a simulator's clock."""

    def __init__(self, nodes: Sequence[tuple[str, Role]], policy: RoutingPolicy,
                 clock: Callable[[], float], *, load_window_s: float = DEFAULT_LOAD_WINDOW_S,
                 forced: Callable[[int], RouteKind | None] | None = None) -> None:
        self.pool = BackendPool(clock=clock)
        for url, role in nodes:
            self.pool.add(url, role)
        self.policy = policy
        self.ledger = SessionLedger(_SESSION_TTL_S, _MAX_SESSIONS, clock)
        self.load = RateMeter(load_window_s, clock)
        self.admission = Admission(self.pool)
        self._forced = forced
        self._observe: Callable[[Session], TurnState] | None = None

    def observe_with(self, observe: Callable[[Session], TurnState]) -> None:
        """Give policy live the cluster's state at each decision (the simulator's engines)."""
        self._observe = observe

    def begin(self, conversation_id: str, turn: int, n_new_tokens: int,
              max_tokens: int) -> Plan:
        """Route one turn: session, load, workload, decision, nodes (slots held)."""
        transcript = Transcript.from_chat(chat_messages(conversation_id, turn))
        lookup = self.ledger.resolve(transcript, conversation_id)
        self.load.record()
        workload = Workload(lookup.turn, n_new_tokens, lookup.cached_tokens, max_tokens,
                            self.load.rate())
        decision = self._decide(lookup, workload, turn)
        lease = self.admission.admit()
        session = lookup.session
        if decision.kind is RouteKind.REPLICA:
            node = self._hold(lease, self.pool.pick(Role.REPLICA, session.decode))
            session.decode = node.url
            return Plan(RouteKind.REPLICA, decision, node, None, workload, lookup, transcript,
                        lease)
        if decision.kind is RouteKind.LOCAL and session.decode is not None:
            home = self.pool.take(session.decode, Role.DECODE)
            if home is not None:
                return Plan(RouteKind.LOCAL, decision, self._hold(lease, home), None, workload,
                            lookup, transcript, lease)
        decode = self._hold(lease, self.pool.pick(Role.DECODE, session.decode))
        prefill = self._hold(lease, self.pool.pick(Role.PREFILL, session.prefill))
        session.prefill, session.decode = prefill.url, decode.url
        return Plan(RouteKind.PD, decision, decode, prefill, workload, lookup, transcript, lease)

    def prefilled(self, plan: Plan) -> None:
        """P's leg answered: its slot is free (the router settles it then)."""
        if plan.prefill is not None:
            plan.lease.settle(plan.prefill, ok=True)

    def end(self, plan: Plan, ok: bool, prompt_tokens: int, completion_tokens: int) -> None:
        """The turn is over: a complete answer is recorded as held by the session's D."""
        if ok:
            plan.lease.settle(plan.decode, ok=True)
            held = plan.transcript.held_after(
                reply_text(plan.session_id, plan.lookup.turn), prompt_tokens + completion_tokens)
            self.ledger.record_turn(plan.lookup, held)
        plan.lease.release()

    def _decide(self, lookup: Lookup, workload: Workload, turn: int) -> Decision:
        # Router._decide, with the x-ppd-route header replaced by `forced` (the profiler's).
        session = lookup.session
        can_local = lookup.continuation and self.pool.is_usable(session.decode, Role.DECODE)
        forced = self._forced(turn) if self._forced is not None else None
        if forced is None or self.policy.kind.value == "replica":
            state = self._observe(session) if self._observe is not None and can_local else None
            return self.policy.decide(workload, session.id, can_local, state)
        if forced is RouteKind.LOCAL and not can_local:
            return Decision(RouteKind.PD, Reason.NO_HOME)
        return Decision(forced, Reason.FORCED)

    @staticmethod
    def _hold(lease: Lease, node: Backend | None) -> Backend:
        if node is None:
            raise RuntimeError("the layout has no node for this route")
        lease.hold(node)
        return node

"""The proxy's routing on a virtual clock: its own pool, session ledger, policy and load meter.

`SimProxy` does what `proxy.routing.router.Router` does for one turn, minus HTTP: the session ledger
(`proxy.sessions.session`) finds the conversation and whether this turn continues it, the load meter
(`proxy.live.load_meter`) measures turns per second, the configured `proxy.policies.RoutingPolicy`
decides the route (ppd reads its `proxy.policies.table.DecisionTable` through
`proxy.shared.discretize`), and
the backend pool (`proxy.upstream.backends`) picks nodes - the session's own first, else the least
loaded - with in-flight slots held through `proxy.upstream.lease` exactly as the router holds them.
Nothing here decides a route or picks a node by itself: `proxy.routing.turn_plan.plan_turn`, which
the router calls too, gives the decision and the nodes to try; this runs them on the clock.

The readback route (docs/readback.md) keeps the proxy's books too: a `ReadbackBook` entry per
session for the ids D's blocks hold after a P->D or readback turn (what D's whole answer
names; the simulator says which ids), offered until D's TTL less the proxy's margin, and taken
by the turn that reads them back; `plan_turn` turns a readback without an entry into P->D with
its reason, as the router does.

Transcripts are chat messages with placeholder text (`conv/turn/user`, `conv/turn/reply`):
the ledger's continuation rule (a request must strictly extend what D holds) sees the same
message structure as a real chat replay, so a turn after a failed one is a new branch here too.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.live.cluster_view import ClusterView
from proxy.live.load_meter import DEFAULT_LOAD_WINDOW_S, RateMeter
from proxy.live.predict import TurnState
from proxy.policies.routing import RoutingPolicy
from proxy.readback.protocol import EXPIRY_MARGIN_S, HeldKV
from proxy.routing import turn_plan
from proxy.routing.turn_machine import TurnMachine, take
from proxy.routing.turn_plan import Pick
from proxy.sessions.ledger import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL_S, SessionLedger
from proxy.sessions.readback_book import ReadbackBook, readback_status, take_readback
from proxy.sessions.session import Lookup, Session, Transcript
from proxy.shared.completion import assistant_message
from proxy.shared.vocabulary import Decision, Node, RouteKind, Workload
from proxy.upstream.backends import Backend, BackendPool
from proxy.upstream.lease import Admission, Lease


@dataclass(slots=True)
class Plan:
    """One turn's nodes, its walk through the proxy's plan (`machine`: the route being run,
    the decision as served, the readback fallbacks), and what the ledger needs when the turn
    ends."""

    machine: TurnMachine
    decode: Backend  # the node that answers (D, the local D, or R)
    prefill: Backend | None  # P on a P->D turn
    workload: Workload
    lookup: Lookup
    transcript: Transcript
    lease: Lease
    held: HeldKV | None = None  # a readback: the ids D's blocks hold (taken from the book)

    @property
    def route(self) -> RouteKind:
        """The route the turn runs (P->D once a readback fell back)."""
        assert self.machine.route is not None
        return self.machine.route

    @property
    def decision(self) -> Decision:
        """The decision as served (a readback served P->D says why)."""
        return self.machine.decision()

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


def hashed_placement(urls: Sequence[str], conversation_id: str, seed: int) -> str | None:
    """The node the PPD paper's proxy gives a new conversation (comprehensive_proxy.py in its
    repository, `select_servers`): `hash(conv_hash) % len(nodes)` of each role, kept for the
    conversation's later turns. Python's str hash is random per process but fixed within
    it, so a conversation is placed at random, ignoring load, and stays; here the draw is a
    stable hash of the conversation and a seed (one per run, as one proxy process per run)."""
    if not urls:
        return None
    digest = hashlib.blake2b(f"{seed}/{conversation_id}".encode(), digest_size=8).digest()
    return urls[int.from_bytes(digest, "big") % len(urls)]


class SimProxy:
    """The proxy's routing state, driven by a simulator's clock."""

    def __init__(self, nodes: Sequence[Node], policy: RoutingPolicy,
                 clock: Callable[[], float], *, load_window_s: float = DEFAULT_LOAD_WINDOW_S,
                 forced: Callable[[int], RouteKind | None] | None = None,
                 readback_ttl_s: float | None = None,
                 placement_seed: int | None = None) -> None:
        self.pool = BackendPool(nodes, clock=clock)
        self._placement_seed = placement_seed
        self.policy = policy
        self.ledger = SessionLedger(DEFAULT_SESSION_TTL_S, DEFAULT_MAX_SESSIONS, clock)
        self.load = RateMeter(load_window_s, clock)
        self.admission = Admission(self.pool)
        self._forced = forced
        self._clock = clock
        # D keeps a turn's blocks for a readback this long (None: the nodes do not offer it).
        self.readback_ttl_s = readback_ttl_s
        self.readback = ReadbackBook(DEFAULT_MAX_SESSIONS, clock)
        self._observe: Callable[[Session], TurnState] | None = None
        self._survey: Callable[[Session], ClusterView] | None = None

    def observe_with(self, observe: Callable[[Session], TurnState] | None,
                     survey: Callable[[Session], ClusterView] | None = None) -> None:
        """Give the policy the cluster at each decision (the simulator's engines): `observe`
        live's `TurnState`, `survey` the `Turn.view` of a policy that needs one."""
        self._observe = observe
        self._survey = survey

    def begin(self, conversation_id: str, turn: int, n_new_tokens: int,
              max_tokens: int) -> Plan:
        """Route one turn: session, load, workload, decision, nodes (slots held)."""
        transcript = Transcript.from_chat(chat_messages(conversation_id, turn))
        lookup = self.ledger.resolve(transcript, conversation_id)
        self.load.record()
        workload = Workload(lookup.turn, n_new_tokens, lookup.cached_tokens, max_tokens,
                            self.load.rate())
        forced = self._forced(turn) if self._forced is not None else None
        plan = turn_plan.plan_turn(self.policy, self.pool, lookup, workload, forced,
                                   self._observe, readback=readback_status(self._book(), lookup),
                                   survey=self._survey)
        lease = self.admission.admit()
        machine = TurnMachine(plan, lookup.session, self._book() is not None,
                              self.policy.spec.needs.readback)
        while (attempt := machine.next_attempt()) is not None:
            if attempt.route is RouteKind.READBACK and not machine.kept(
                    take_readback(self._book(), lookup)):
                continue  # the plan's P->D attempt serves it
            nodes = [take(self.pool, self._placed(pick, conversation_id))
                     for pick in attempt.picks]
            if None in nodes and not machine.last:
                machine.unserved()
                continue  # the session's D cannot take it now: the next attempt (P->D)
            decode, *prefill = [self._hold(lease, node) for node in nodes]
            machine.served(decode.url, prefill[0].url if prefill else None)
            return Plan(machine, decode, prefill[0] if prefill else None,
                        workload, lookup, transcript, lease, machine.take_held())
        raise AssertionError("a turn plan ends with an attempt that serves or raises")

    def prefilled(self, plan: Plan) -> None:
        """P's leg answered: its slot is free (the router settles it then)."""
        if plan.prefill is not None:
            plan.lease.settle(plan.prefill, ok=True)

    def end(self, plan: Plan, ok: bool, prompt_tokens: int, completion_tokens: int,
            kept_ids: Sequence[int] | None = None) -> None:
        """The turn is over: a complete answer is recorded as held by the session's D, and
        `kept_ids`, the ids whose KV D keeps for a readback (a P->D or readback turn)."""
        if ok:
            plan.lease.settle(plan.decode, ok=True)
            held = plan.transcript.held_after(
                reply_text(plan.session_id, plan.lookup.turn), prompt_tokens + completion_tokens)
            recorded = self.ledger.record_turn(plan.lookup, held)
            if recorded is not None and self.readback_ttl_s is not None:
                if kept_ids and plan.machine.keeps():
                    self.readback.put(recorded.id, held.digest, HeldKV(
                        {}, plan.decode.url, array("q", kept_ids),
                        self._clock() + self.readback_ttl_s - EXPIRY_MARGIN_S))
                else:
                    self.readback.discard(recorded.id)
        plan.lease.release()

    def _placed(self, pick: Pick, conversation_id: str) -> Pick:
        """With the paper's placement, a pick without a home prefers the conversation's
        hashed node (`hashed_placement`); the pool still takes another if it is unusable."""
        if self._placement_seed is None or pick.prefer is not None or pick.only_preferred:
            return pick
        urls = sorted(node.url for node in self.pool.nodes(pick.role))
        return replace(pick, prefer=hashed_placement(urls, conversation_id, self._placement_seed))

    @staticmethod
    def _hold(lease: Lease, node: Backend | None) -> Backend:
        if node is None:
            raise RuntimeError("the layout has no node for this route")
        lease.hold(node)
        return node

    def _book(self) -> ReadbackBook | None:
        """The readback book, when this cluster's Ds keep blocks for a readback."""
        return self.readback if self.readback_ttl_s is not None else None

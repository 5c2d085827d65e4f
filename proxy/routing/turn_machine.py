"""One turn from its plan to its end, once for the proxy and the simulator: no I/O.

`proxy.routing.turn_plan.plan_turn` decides a turn (its route, and the attempts that may serve it);
`TurnMachine` walks that plan. It says which attempt runs next (`next_attempt`) and the legs
it sends, in order (`legs`: P's /tokenize and P's leg before a readback's D leg, P's leg
before a P->D D leg, one leg otherwise); it takes the fallbacks between them - a readback
whose kept blocks the book no longer has (`kept`), or too few of whose tokens are the new
prompt's (`tokenized`, the readback-mismatch rule), or that P declined to read
(`declined`), runs P->D and says why; it says whether D keeps a leg's blocks for a later
readback (`keeps`, the keep-blocks rule), which node a pick takes (`take`), records the
session's home once nodes served it (`served`), and labels the decision with the route that
served the turn (`decision`).

The machine neither sends nor waits: `proxy.routing.router.Router` carries each leg out over HTTP
(with `proxy.routing.failover` trying the nodes of a role in turn) and the simulator
(`profiler.simulator.sim_proxy`, `profiler.simulator.node_protocol`) on engines in
virtual time; both ask it at each step and feed back what happened, so each rule here holds
in both and the simulator cannot drift from the proxy it models.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from proxy.readback.protocol import MIN_READBACK_TOKENS, HeldKV, matched_tokens, wants_token_ids
from proxy.routing.turn_plan import Attempt, Pick, TurnPlan
from proxy.sessions.session import Session
from proxy.shared.vocabulary import Decision, Reason, RouteKind
from proxy.upstream.backends import Backend, BackendPool


class Leg(enum.Enum):
    """One request a turn sends to a node."""

    TOKENIZE = "tokenize"  # P's /tokenize of the new prompt: which kept tokens match
    PREFILL = "prefill"  # P's leg: one token, the KV handed to D
    ANSWER = "answer"  # the leg whose reply the client gets (D after P, the local D, R)


_LEGS: dict[RouteKind, tuple[Leg, ...]] = {
    RouteKind.PD: (Leg.PREFILL, Leg.ANSWER),
    RouteKind.READBACK: (Leg.TOKENIZE, Leg.PREFILL, Leg.ANSWER),
    RouteKind.LOCAL: (Leg.ANSWER,),
    RouteKind.REPLICA: (Leg.ANSWER,),
}
# Routes whose answering leg D can be asked to keep its blocks for (a P->D or readback D
# leg carries kv_transfer_params; a local leg gets empty ones to that end:
# proxy.readback.protocol.KEEP_BLOCKS). A replica keeps nothing: it has no P to read them.
_KEEPING = frozenset({RouteKind.PD, RouteKind.READBACK, RouteKind.LOCAL})


def legs(route: RouteKind) -> tuple[Leg, ...]:
    """The legs a route sends, in order."""
    return _LEGS[route]


def keeps_blocks(route: RouteKind, offered: bool, reads_back: bool,
                 body: Mapping[str, Any] | None = None) -> bool:
    """Whether D keeps this turn's blocks for a readback when its answering leg ends: the
    nodes offer it (`offered`: bidirectional transfer with a TTL), the policy may read them
    back (`reads_back`: its `Needs.readback`), the route's D leg can ask for it, and the
    answer is whole with one sequence (vLLM names the blocks in a whole answer only, and
    the proxy needs the token ids the client did not ask for itself) - `body`, the client's
    request; None: a turn known to be whole (the simulator's).

    A policy that never reads back (pd, local, ...) keeps nothing: kept blocks stay pinned
    in D's KV for the whole TTL (vLLM's default 480 s), and on production traffic that
    pinning fills D for a readback no one will ask for. A turn forced to readback under such
    a policy finds nothing kept and runs P->D (reason readback_missing)."""
    if not offered or not reads_back or route not in _KEEPING:
        return False
    return body is None or (not body.get("stream", False)
                            and not wants_token_ids(dict(body))
                            and body.get("n", 1) == 1)  # one sequence: its blocks are the history


def read_back_tokens(held: Sequence[int], prompt: Sequence[int] | None) -> int | None:
    """How many leading tokens of the new prompt P reads from D's kept blocks (their common
    prefix), or None when too few match for a readback to pay (vLLM recomputes a span
    shorter than MIN_READBACK_TOKENS) or P gave no ids: the turn goes P->D."""
    matched = matched_tokens(held, prompt) if prompt is not None else 0
    return matched if matched >= MIN_READBACK_TOKENS else None


def take(pool: BackendPool, pick: Pick, exclude: frozenset[str] = frozenset()) -> Backend | None:
    """The node a pick takes now (counted as picked), or None: a pick limited to the
    session's node takes it or nothing (a local turn); another takes the preferred node if
    usable, else the least busy usable one not excluded."""
    if pick.only_preferred:
        return pool.take(pick.prefer, pick.role) if pick.prefer is not None else None
    return pool.pick(pick.role, pick.prefer, exclude)


class TurnMachine:
    """One turn's walk through its plan (see the module docstring); one per turn."""

    def __init__(self, plan: TurnPlan, session: Session, offered: bool,
                 reads_back: bool) -> None:
        self.plan = plan
        self.session = session
        self.offered = offered  # the nodes keep blocks for readbacks
        self.reads_back = reads_back  # the policy may read them back (`Needs.readback`)
        self._attempts: Iterator[Attempt] = iter(plan.attempts)
        self.attempt: Attempt | None = None
        self.route: RouteKind | None = None  # the route being tried, then the one served
        self.fallback: Reason | None = None  # why a readback was served P->D instead
        self.held: HeldKV | None = None  # a readback's kept blocks, taken from the book
        self.read_back = 0  # tokens P was told to read from D

    def next_attempt(self) -> Attempt | None:
        """The plan's next attempt (None: none left); its route is the one being tried."""
        self.attempt = next(self._attempts, None)
        if self.attempt is not None:
            self.route = self.attempt.route
        return self.attempt

    @property
    def last(self) -> bool:
        """The attempt being tried is the plan's last (its fallback is the turn's end)."""
        return self.attempt is self.plan.attempts[-1]

    def legs(self) -> tuple[Leg, ...]:
        """The legs of the attempt being tried."""
        assert self.route is not None
        return legs(self.route)

    def kept(self, taken: HeldKV | Reason) -> bool:
        """The readback book's answer for a readback attempt: the session's kept blocks, or
        why there are none (then False: the attempt is skipped for the plan's P->D)."""
        if isinstance(taken, HeldKV):
            self.held = taken
            return True
        self.fallback = taken
        return False

    def unserved(self) -> None:
        """The attempt found no node for one of its picks: the next attempt runs."""
        if self.route is RouteKind.READBACK:
            self.fallback, self.held = Reason.NO_HOME, None

    def take_held(self) -> HeldKV | None:
        """The kept blocks for the first P leg that tries them (a retry on another P, or
        another D, is plain P->D)."""
        held, self.held = self.held, None
        return held

    def tokenized(self, held: HeldKV, prompt: Sequence[int] | None) -> int | None:
        """P's ids of the new prompt, against the kept blocks: the tokens P reads back, or
        None when too few match - the turn goes P->D (reason readback_mismatch)."""
        matched = read_back_tokens(held.token_ids, prompt)
        if matched is None:
            self.fallback, self.route = Reason.READBACK_MISMATCH, RouteKind.PD
            return None
        self.read_back, self.route = matched, RouteKind.READBACK
        return matched

    def declined(self) -> None:
        """P declined to read the kept blocks (they are gone, a transfer failed): the turn
        is redone on that P as plain P->D (reason readback_declined)."""
        self.fallback, self.route = Reason.READBACK_DECLINED, RouteKind.PD

    def keeps(self, body: Mapping[str, Any] | None = None) -> bool:
        """Whether the answering leg of the route being tried asks D to keep its blocks."""
        return self.route is not None and keeps_blocks(self.route, self.offered,
                                                       self.reads_back, body)

    def pins(self) -> bool:
        """Whether D pins the answering leg's blocks for the TTL when it ends, as vLLM does
        (NIXL's `request_finished`, docs/readback.md): on nodes that offer the readback, every
        D leg that carries kv_transfer_params - a P->D or readback D leg always (it carries
        P's, and no field opts it out), a local leg only when the proxy asks (`keeps`).
        So a policy that never reads back still leaves its P->D turns' blocks pinned; only
        `--no-kv-readback` (or a shorter TTL) frees them. The simulator pins by this rule."""
        if not self.offered or self.route is None:
            return False
        return self.route in (RouteKind.PD, RouteKind.READBACK) or self.keeps()

    def served(self, decode: str, prefill: str | None = None) -> None:
        """The nodes that serve the turn: they become the session's home (a replica is its
        `decode`; a local turn's D already is)."""
        self.session.decode = decode
        if prefill is not None:
            self.session.prefill = prefill

    def decision(self, route: RouteKind | None = None) -> Decision:
        """The decision as served (`route`: the route that served it, else the one being
        tried): a readback served P->D says why."""
        served = route if route is not None else self.route
        decision = self.plan.decision
        if decision.kind is RouteKind.READBACK and served is not RouteKind.READBACK \
                and served is not None:
            # No table cell: the cell's verdict (readback) is not what served the turn.
            return replace(decision, kind=served, cell=None,
                           reason=self.fallback or Reason.READBACK_MISSING)
        return decision

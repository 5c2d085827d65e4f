"""Routing policies: pure functions of a turn's workload and what the cluster allows.

`RoutingPolicy.decide(workload, session_id, can_local)` reads no clock and does no I/O, so the
proxy and a simulator call the same code. `can_local` is the cluster view a policy needs: the
request continues its session and the session's D is healthy (otherwise only P->D can serve);
live also reads `can_pd` (a usable P and D exist).

- pd: every turn P->D (x=0).            - local: turn 2+ on the session's D (x=1).
- fixed: turn 2+ local with probability x, drawn from a stable hash of (session, turn).
- threshold: local iff the uncached suffix n_in <= N tokens (llm-d's prefix-based decider).
- replica: no P; one node does prefill and decode.
- ppd: the decision table's verdict for the turn's cell. A cell the table lacks goes P->D,
  the route that needs no cached state (reason MISSING_CELL, counted in metrics).
- live: both routes predicted from the cluster's state now (`proxy.live`: what D still
  holds, the nodes' batches and queues, a step-cost model); a table, when given, decides
  while D holds the whole history (the state it measured). P->D for a session D partly
  evicted has reason EVICTED. In a hybrid pool (R nodes beside P and D) live also places a
  conversation without a home (turn 1, or its node gone) on a replica or P->D by the same
  score (REPLICA_LIVE when the replica wins); a conversation on a replica keeps it
  (REPLICA_HOME) while it is usable. When every P or every D is down, P->D is counted out,
  not predicted from nodes it knows nothing of: placements go to a replica, a session's turn
  stays on its D - so a hybrid pool is served by its replicas alone (`serving_roles`).
Turn 1 is otherwise always P->D in the disaggregated policies, which leave a hybrid pool's
replicas idle; replica leaves its P and D nodes idle.
"""

from __future__ import annotations

import hashlib

from proxy.config import Policy, PolicyConfig
from proxy.discretize import classify
from proxy.live import (
    LiveScorer,
    NodeState,
    StepCosts,
    TurnState,
    predict,
    predict_placement,
)
from proxy.table import DecisionTable
from proxy.vocabulary import Decision, Reason, Role, RouteKind, Workload

_UNKNOWN = TurnState(NodeState(), NodeState())


def stable_fraction(session_id: str, turn: int) -> float:
    """A deterministic draw in [0, 1) per (session, turn); unlike hash(), stable across runs."""
    digest = hashlib.blake2b(f"{session_id}\x00{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class RoutingPolicy:
    """The configured policy, with the decision table's verdicts precomputed (ppd)."""

    def __init__(self, config: PolicyConfig, table: DecisionTable | None = None,
                 costs: StepCosts | None = None) -> None:
        if config.kind is Policy.PPD and table is None:
            raise ValueError("policy ppd needs a decision table")
        if config.kind is Policy.LIVE and costs is None:
            raise ValueError("policy live needs a step-cost model")
        self.config = config
        self.table = table
        self.costs = costs
        self.scorer = LiveScorer(config.w_ttft, config.w_tpot)
        self._verdicts = (table.decisions(config.w_ttft, config.w_tpot, config.success_margin)
                          if table is not None and config.kind in (Policy.PPD, Policy.LIVE)
                          else {})

    @property
    def kind(self) -> Policy:
        """The configured policy."""
        return self.config.kind

    @property
    def serving_roles(self) -> tuple[tuple[Role, ...], ...]:
        """Sets of roles, any one of which (a usable node of each) serves every turn: replica
        needs a replica; live a P->D pair, or a replica (it places every conversation there
        when P->D cannot serve); the other policies a P->D pair."""
        if self.config.kind is Policy.REPLICA:
            return ((Role.REPLICA,),)
        if self.config.kind is Policy.LIVE:
            return ((Role.PREFILL, Role.DECODE), (Role.REPLICA,))
        return ((Role.PREFILL, Role.DECODE),)

    def decide(self, workload: Workload, session_id: str, can_local: bool,
               state: TurnState | None = None, *, replica_home: bool = False,
               can_pd: bool = True) -> Decision:
        """The route of one turn (`state`: the cluster now, read by policy live only;
        `replica_home`: the turn continues a conversation whose replica is usable; `can_pd`:
        the pool has a usable P and D - live does not predict a route that cannot run)."""
        kind = self.config.kind
        if kind is Policy.REPLICA:
            return Decision(RouteKind.REPLICA, Reason.REPLICA)
        if kind is Policy.LIVE:
            self.scorer.count_turn(workload)
            if replica_home:  # its prefix cache holds the history
                return Decision(RouteKind.REPLICA, Reason.REPLICA_HOME)
            homeless = workload.turn <= 1 or not can_local
            if homeless and state is not None and state.replica is not None:
                if not can_pd:
                    return Decision(RouteKind.REPLICA, Reason.REPLICA_LIVE)
                return self._place_live(workload, state)
            if not homeless and not can_pd:
                return Decision(RouteKind.LOCAL, Reason.LIVE)
        if workload.turn <= 1:
            return Decision(RouteKind.PD, Reason.TURN1)
        if not can_local:
            return Decision(RouteKind.PD, Reason.NO_HOME)
        if kind is Policy.PD:
            return Decision(RouteKind.PD, Reason.POLICY)
        if kind is Policy.LOCAL:
            return Decision(RouteKind.LOCAL, Reason.POLICY)
        if kind is Policy.FIXED:
            x = self.config.x or 0.0
            local = stable_fraction(session_id, workload.turn) < x
            return Decision(RouteKind.LOCAL if local else RouteKind.PD, Reason.DRAW)
        if kind is Policy.THRESHOLD:
            limit = self.config.non_cached_tokens or 0
            return Decision(RouteKind.LOCAL if workload.n_in <= limit else RouteKind.PD,
                            Reason.THRESHOLD)
        if kind is Policy.LIVE:
            return self._decide_live(workload, state or _UNKNOWN)
        return self._decide_table(workload)

    def _decide_live(self, workload: Workload, state: TurnState) -> Decision:
        assert self.costs is not None
        held = state.decode.held_tokens
        if self.table is not None and (held is None or held >= workload.n_ctx):
            prior = self._decide_table(workload)
            if prior.reason is Reason.TABLE:
                return prior
        prediction = predict(workload, state, self.costs)
        # Without residency (no KV events for this session on its D) live is blind to
        # eviction: its own reason says so (docs/live-routing.md).
        live = Reason.LIVE if held is not None else Reason.LIVE_BLIND
        if self.scorer.score(prediction) > 0:
            return Decision(RouteKind.LOCAL, live)
        return Decision(RouteKind.PD, Reason.EVICTED if prediction.missing_tokens > 0
                        else live)

    def _place_live(self, workload: Workload, state: TurnState) -> Decision:
        """A conversation without a home, in a hybrid pool: a replica or P->D."""
        assert self.costs is not None
        first = workload.turn <= 1
        prediction = predict_placement(workload, state, self.costs)
        if self.scorer.score(prediction, first_turn=first) > 0:
            return Decision(RouteKind.REPLICA, Reason.REPLICA_LIVE)
        return Decision(RouteKind.PD, Reason.TURN1 if first else Reason.NO_HOME)

    def _decide_table(self, workload: Workload) -> Decision:
        assert self.table is not None
        cell = classify(workload.n_ctx, workload.n_in, workload.n_out, workload.qps,
                        self.table.qps_points)
        verdict = self._verdicts.get(cell)
        if verdict is None:
            return Decision(RouteKind.PD, Reason.MISSING_CELL, cell)
        return Decision(verdict, Reason.TABLE, cell)

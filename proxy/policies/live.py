"""`--policy live --live-costs PATH`: the routes predicted from the cluster's state now.

`proxy.live` predicts each route (what D still holds, the nodes' batches and queues, a
step-cost model) and scores the prediction as the decision table would (`LiveScorer`, the
running means it learns: passed in and handed back, so `decide` stays pure). A table, when
given, decides while D holds the whole history (the state it measured). P->D for a session D
partly evicted has reason EVICTED. When the session's D keeps the history's blocks for a
readback (docs/readback.md), the readback is priced too (its TTFT gain over P->D; D's batch
is untouched) and taken when it scores above both local's score and P->D's zero.

In a hybrid pool (R nodes beside P and D) live also places a conversation without a home
(turn 1, or its node gone) on a replica or P->D by the same score (REPLICA_LIVE when the
replica wins); a conversation on a replica keeps it (REPLICA_HOME) while it is usable. When
every P or every D is down, P->D is counted out, not predicted from nodes it knows nothing
of: placements go to a replica, a session's turn stays on its D - so a hybrid pool is served
by its replicas alone (ROLES).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.live import (
    LiveScorer,
    NodeState,
    Prediction,
    TurnState,
    predict,
    predict_placement,
)
from proxy.options import option
from proxy.policies import ppd
from proxy.policies.base import PD_PAIR, Inputs, Need, Needs, Turn, disaggregated_default
from proxy.policies.ppd import (
    WEIGHTS_LABEL,
    label_weights,
    needed_table,
    table_decision,
    weights_label,
)
from proxy.vocabulary import Decision, Reason, Role, RouteCost, RouteKind

NAME = "live"
NEEDS = Needs(table=Need.OPTIONAL, costs=Need.REQUIRED, live_view=True, readback=True)
ROLES = (PD_PAIR, (Role.REPLICA,))
PLACES = True
_TABLE_LABEL = "-table"  # live with the layout's table as its prior
inputs = ppd.inputs  # the table, live's prior, read at ppd's weights
_LABEL = re.compile(rf"^{NAME}(?P<table>{_TABLE_LABEL})?{WEIGHTS_LABEL}")
_UNKNOWN = TurnState(NodeState(), NodeState())
LABEL_HELP = f"{NAME}, {NAME}{_TABLE_LABEL}, {NAME}-wtpotW"


@dataclass(frozen=True)
class Flags(ppd.Flags):
    live_costs: Path | None = option(
        None, "policy live: step-cost file (JSON; `ppd sim live-costs` writes one)",
        metavar="PATH")


def remember(config: Any) -> LiveScorer:
    """The running means live starts from."""
    return LiveScorer(config.w_ttft, config.w_tpot)


def label(config: Any) -> str:
    prior = _TABLE_LABEL if config.table is not None else ""
    return f"{NAME}{prior}{weights_label(config)}"


def parse_label(text: str, table: Callable[[], Path | None]) -> dict[str, Any] | None:
    match = _LABEL.match(text)
    if match is None:
        return None
    return {"table": needed_table(text, table) if match["table"] else None,
            **label_weights(match)}


def describe(config: Any) -> str:
    return f"costs {config.live_costs}, w_ttft={config.w_ttft:g}, w_tpot={config.w_tpot:g}"


def decide(turn: Turn, inputs: Inputs, scorer: LiveScorer) -> tuple[Decision, LiveScorer]:
    """The route of one turn, and the running means with this turn counted."""
    workload, state = turn.workload, turn.state
    scorer = scorer.counted(workload)
    if turn.replica_home:  # its prefix cache holds the history
        return Decision(RouteKind.REPLICA, Reason.REPLICA_HOME), scorer
    homeless = workload.turn <= 1 or not turn.can_local
    if homeless and state is not None and state.replica is not None:
        if not turn.can_pd:
            return Decision(RouteKind.REPLICA, Reason.REPLICA_LIVE), scorer
        return _place(turn, state, inputs, scorer)
    if not homeless and not turn.can_pd:
        return Decision(RouteKind.LOCAL, Reason.LIVE), scorer
    default = disaggregated_default(turn)
    if default is not None:
        return default, scorer
    return _predicted(turn, state or _UNKNOWN, inputs, scorer)


def _predicted(turn: Turn, state: TurnState, inputs: Inputs,
               scorer: LiveScorer) -> tuple[Decision, LiveScorer]:
    assert inputs.costs is not None
    workload = turn.workload
    held = state.decode.held_tokens
    if inputs.table is not None and (held is None or held >= workload.n_ctx):
        prior = table_decision(workload, inputs)
        if prior.reason is Reason.TABLE:
            return prior, scorer
    prediction = predict(workload, state, inputs.costs)
    score, scorer = scorer.scored(prediction)
    # Without residency (no KV events for this session on its D) live is blind to
    # eviction: its own reason says so (docs/live-routing.md).
    live = Reason.LIVE if held is not None else Reason.LIVE_BLIND
    readback = scorer.readback_score(prediction)
    costs = _predicted_costs(prediction)
    if readback is not None and readback > max(score, 0.0):
        return Decision(RouteKind.READBACK, live, costs=costs), scorer
    if score > 0:
        return Decision(RouteKind.LOCAL, live, costs=costs), scorer
    return Decision(RouteKind.PD, Reason.EVICTED if prediction.missing_tokens > 0
                    else live, costs=costs), scorer


def _predicted_costs(prediction: Prediction) -> tuple[RouteCost, ...]:
    """The TTFTs live weighed (x-ppd-costs, `proxy.explain`); the turn decodes in D's batch
    either way, so its TPOT is not what tells the routes apart."""
    costs: tuple[RouteCost, ...] = (RouteCost(RouteKind.PD, prediction.ttft_pd_ms),
                                    RouteCost(RouteKind.LOCAL, prediction.ttft_local_ms))
    if prediction.ttft_readback_ms is not None:
        costs += (RouteCost(RouteKind.READBACK, prediction.ttft_readback_ms),)
    return costs


def _place(turn: Turn, state: TurnState, inputs: Inputs,
           scorer: LiveScorer) -> tuple[Decision, LiveScorer]:
    """A conversation without a home, in a hybrid pool: a replica or P->D."""
    assert inputs.costs is not None
    first = turn.workload.turn <= 1
    prediction = predict_placement(turn.workload, state, inputs.costs)
    score, scorer = scorer.scored(prediction, first_turn=first)
    # Each route's TTFT, and the TPOT of the batch the conversation then decodes in.
    joins_replica, joins_d = prediction.joins_local, prediction.joins_pd
    costs = (RouteCost(RouteKind.REPLICA, prediction.ttft_local_ms,
                       joins_replica.own_step_ms if joins_replica is not None else None),
             RouteCost(RouteKind.PD, prediction.ttft_pd_ms,
                       joins_d.own_step_ms if joins_d is not None else None))
    if score > 0:
        return Decision(RouteKind.REPLICA, Reason.REPLICA_LIVE, costs=costs), scorer
    return Decision(RouteKind.PD, Reason.TURN1 if first else Reason.NO_HOME,
                    costs=costs), scorer

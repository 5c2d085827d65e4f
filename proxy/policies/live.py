"""`--policy live --live-costs PATH`: the routes predicted from the cluster's state now.

`proxy.live.predict` predicts each route (what D still holds, the nodes' batches and queues, a
step-cost model) and scores the prediction as the decision table would (`LiveScorer`, the
running means it learns: passed in and handed back, so `decide` stays pure). A table, when
given, decides while D holds the whole history (the state it measured). P->D for a session D
partly evicted has reason EVICTED. When the session's D keeps the history's blocks for a
readback (docs/readback.md), the readback is priced too (its TTFT gain over P->D; D's batch
is untouched) and taken when it scores above both local's score and P->D's zero.

Live also picks the nodes (`proxy.live.nodes`, with `Turn.view`): a P->D turn - turn 1, or
a turn 2+ the score sends there - decodes on the D its route prices best (another than the
session's when that one lost the history, runs a heavier batch or lacks room for the
prompt, which also rules local out), and prefills on the P with the least prefill work ahead.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from proxy.live.cluster_view import ClusterView
from proxy.live.nodes import (
    arrivals_delayed,
    least_prefill_work,
    moved,
    node_state,
    placement_decode,
    placement_local,
    roomy,
    saves_time,
)
from proxy.live.predict import (
    NodeState,
    Prediction,
    TurnState,
    _has_room,
    predict,
    predict_placement,
)
from proxy.live.scorer import LiveScorer
from proxy.policies import ppd
from proxy.policies.base import PD_PAIR, Inputs, Need, Needs, Turn, disaggregated_default
from proxy.policies.ppd import (
    WEIGHTS_LABEL,
    label_weights,
    needed_table,
    table_decision,
    weights_label,
)
from proxy.shared.options import option
from proxy.shared.vocabulary import Decision, Reason, Role, RouteCost, RouteKind

NAME = "live"
NEEDS = Needs(table=Need.OPTIONAL, costs=Need.REQUIRED, live_view=True, readback=True,
              view=True)
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


def costs_path(config: Any) -> Path | None:
    """The step-cost file the configuration names (`--live-costs`)."""
    path: Path | None = config.live_costs
    return path


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
        return _placed(default, turn, inputs, scorer)
    return _predicted(turn, state or _UNKNOWN, inputs, scorer)


def _placed(decision: Decision, turn: Turn, inputs: Inputs,
            scorer: LiveScorer) -> tuple[Decision, LiveScorer]:
    """A homeless turn: P->D on the D its route prices best and the P with the least prefill
    work ahead, or served whole on a D where that saves more time than it costs and scores
    above P->D (`proxy.live.nodes`); the pool's default pick without a view."""
    view = turn.view
    if view is None or inputs.costs is None:
        return decision, scorer
    prefill = least_prefill_work(view, turn.workload.n_ctx + turn.workload.n_in)
    prefill_state = node_state(prefill) if prefill else NodeState()
    decode = placement_decode(turn.workload, view, prefill_state, inputs.costs, scorer)
    placed = replace(decision, decode=decode.url if decode else None,
                     prefill=prefill.url if prefill else None)
    if decode is None or prefill is None:
        return placed, scorer
    local = placement_local(turn.workload, view, prefill_state, decode, inputs.costs, scorer)
    if local is None:
        return placed, scorer
    prediction, node = local
    # Scored on the turn's own P->D TTFT, not a running turn-1 mean: the means placement_decode
    # weighs Ds by stay as they were.
    costs = _predicted_costs(prediction)
    if scorer.score(prediction, first_turn=True) > 0:
        return Decision(RouteKind.LOCAL, decision.reason, costs=costs, decode=node.url), scorer
    return replace(placed, costs=costs), scorer


def _best_decode(turn: Turn, view: ClusterView, state: TurnState, base: Prediction,
                 inputs: Inputs, scorer: LiveScorer) -> tuple[Prediction, str | None, bool]:
    """P->D's best D for a turn 2+ (`proxy.live.nodes`): its prediction, its URL (None: the
    session's own), and whether local can run (the session's D has room for the prompt, or
    no D has)."""
    assert inputs.costs is not None
    prompt = turn.workload.n_ctx + turn.workload.n_in
    others = [node for node in roomy(view.usable(Role.DECODE), prompt)
              if node.url != view.home_decode]
    room_elsewhere = any(_has_room(node_state(node), prompt) for node in others)
    home_fits = _has_room(state.decode, prompt) or not room_elsewhere
    candidates: list[tuple[Prediction, str | None]] = [(base, None)] if home_fits else []
    candidates += [(moved(turn.workload, state, base, node_state(node), inputs.costs), node.url)
                   for node in others]
    if not candidates:
        return base, None, home_fits
    prediction, url = min(candidates, key=lambda c: scorer.score(c[0]))
    return prediction, url, home_fits


def _predicted(turn: Turn, state: TurnState, inputs: Inputs,
               scorer: LiveScorer) -> tuple[Decision, LiveScorer]:
    assert inputs.costs is not None
    workload = turn.workload
    held = state.decode.held_tokens
    if inputs.table is not None and (held is None or held >= workload.n_ctx):
        prior = table_decision(workload, inputs)
        if prior.reason is Reason.TABLE:
            return prior, scorer
    base = prediction = predict(workload, state, inputs.costs)
    decode, local_fits, view = None, True, turn.view
    if view is not None:
        base = prediction = arrivals_delayed(workload, view, base)
        prediction, decode, local_fits = _best_decode(turn, view, state, base, inputs, scorer)
    prefill = (least_prefill_work(view, workload.n_ctx + workload.n_in) if view is not None
               else None)
    prefill_url = prefill.url if prefill is not None else None
    score, scorer = scorer.scored(prediction)
    # Without residency (no KV events for this session on its D) live is blind to
    # eviction: its own reason says so (docs/live-routing.md).
    live = Reason.LIVE if held is not None else Reason.LIVE_BLIND
    readback = scorer.readback_score(prediction)
    costs = _predicted_costs(prediction)
    if readback is not None and readback > max(score, 0.0) and local_fits:
        return Decision(RouteKind.READBACK, live, costs=costs, prefill=prefill_url), scorer
    # Local also has to save more time than it costs D (`saves_time`): P->D's whole TTFT
    # against local's and the stall its prefill adds to D's batch, queue and arrivals.
    if score > 0 and local_fits and saves_time(prediction, prediction.ttft_pd_ms):
        return Decision(RouteKind.LOCAL, live, costs=costs, decode=decode,
                        prefill=prefill_url), scorer
    return Decision(RouteKind.PD, Reason.EVICTED if base.missing_tokens > 0 else live,
                    costs=costs, decode=decode, prefill=prefill_url), scorer


def _predicted_costs(prediction: Prediction) -> tuple[RouteCost, ...]:
    """The TTFTs live weighed (x-ppd-costs, `proxy.shared.explain`); the turn decodes in D's batch
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

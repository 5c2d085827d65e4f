"""What a policy module declares, and what its `decide` is given.

A policy is one module of this package (`proxy.policies.registry` finds it by its `NAME`):

    NAME = "always-local"                      # required: the --policy value
    def decide(turn: Turn, inputs: Inputs) -> Decision: ...   # required, pure

and, when it needs them (the registry fills in the defaults):

    @dataclass(frozen=True)                    # its own flags: `proxy.shared.options.option` fields
    class Flags: x: float | None = option(None, "help", metavar="F")
    NEEDS = Needs(table=Need.REQUIRED)         # default: nothing beyond the turn
                                               # (Needs(view=True): turn.view, the cluster now)
    ROLES = ((Role.PREFILL, Role.DECODE),)     # role sets that serve its turns; [0] to start
    PLACES = True                              # may place a homeless conversation on a replica
    IGNORES_FORCING = True                     # x-ppd-route does not apply (no P/D routes)
    def check(config) -> None                  # flag combinations it rejects (ValueError)
    def label(config) -> str                   # its name in reports (default NAME)
    def parse_label(text, table) -> dict|None  # a report label back to flags (default NAME)
    LOCAL_SHARE = 0.0                          # a fixed share of turn 2+ run locally, or
    def local_share(config) -> float           # one its flags set (fixed's --x); default:
                                               # none, it decides turn by turn
    def describe(config) -> str                # startup-line detail (default "")
    def remember(config) -> M                  # learned state; then decide(turn, inputs, M)
                                               # returns (Decision, M): decide stays pure
    def inputs(config, table, costs) -> Inputs # what decide is given, loaded once (default:
                                               # Inputs(config, table, costs=costs))
    DEFAULT = True                             # `--policy`'s default (one policy: pd)
    def table_path(config) -> Path | None      # the file its flags name, for the proxy and
    def costs_path(config) -> Path | None      # the simulator to load (ppd: --table, live:
                                               # --live-costs): registry.table_path/costs_path

`decide` returns a `Decision`: the route, and optionally the nodes that serve it
(`Decision.decode`, `Decision.prefill`: URLs a policy read from `turn.view`; None leaves the
pick to the pool - the session's node, else the least busy).

`decide` reads no clock and does no I/O: the proxy (`proxy.routing.router`) and the simulator
(`profiler.simulator.sim_proxy`) call the same function through `RoutingPolicy`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from proxy.live.cluster_view import ClusterView
from proxy.live.predict import StepCosts, TurnState
from proxy.policies.table import DecisionTable
from proxy.shared.discretize import Cell
from proxy.shared.vocabulary import Decision, Reason, Role, RouteKind, Workload

PD_PAIR: tuple[Role, ...] = (Role.PREFILL, Role.DECODE)


class Need(enum.Enum):
    """Whether a policy needs an input: not at all, if given, or always."""

    NO = "no"
    OPTIONAL = "optional"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class Needs:
    """What a policy reads besides the turn: a decision table (`--table`), a step-cost model
    (`--live-costs`, or in the simulator one fitted to the run's preset), the cluster's
    state now (`proxy.live.view`: KV events and /metrics; the engines in the simulator), and
    whether the session's D keeps blocks for a readback now (`Turn.can_readback`, or a
    `readback` decision that needs them): the router asks its readback book - a Redis round
    trip when the sessions are shared - only for such a policy, or a turn forced to readback;
    and `view`: every usable node with its gauges and what it caches of the turn
    (`Turn.view`, a `proxy.live.cluster_view.ClusterView`), built for such a policy only."""

    table: Need = Need.NO
    costs: Need = Need.NO
    live_view: bool = False
    readback: bool = False
    view: bool = False


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn as a policy sees it.

    can_local: the request continues its session and the session's D is usable.
    state: the cluster now (policies that need the live view; None: not observed).
    replica_home: the conversation lives on a usable replica (a hybrid pool).
    can_pd: a usable P and D exist (told only to policies that place; True otherwise).
    can_readback: the session's D keeps blocks P can read back now (docs/readback.md).
    view: every usable node now, and the session's home (policies with `Needs(view=True)`;
      None for the others).
    """

    workload: Workload
    session_id: str
    can_local: bool
    state: TurnState | None = None
    replica_home: bool = False
    can_pd: bool = True
    can_readback: bool = False
    view: ClusterView | None = None


@dataclass(frozen=True, slots=True)
class Inputs:
    """What a policy was configured with, loaded once: its flags (`config`), the decision
    table and its verdicts per cell at the configured weights (between pd and local, and,
    when the table measured the third route, among all three), and the step costs."""

    config: Any  # proxy.config.policy_config.PolicyConfig (built from every policy's FLAGS)
    table: DecisionTable | None = None
    verdicts: dict[Cell, RouteKind] | None = None
    costs: StepCosts | None = None
    readback_verdicts: dict[Cell, RouteKind] | None = None


def disaggregated_default(turn: Turn) -> Decision | None:
    """What every P/D policy answers before its own rule: turn 1 and a turn whose session has
    no usable D go P->D (the only route that needs no cached state); None: the policy decides."""
    if turn.workload.turn <= 1:
        return Decision(RouteKind.PD, Reason.TURN1)
    if not turn.can_local:
        return Decision(RouteKind.PD, Reason.NO_HOME)
    return None

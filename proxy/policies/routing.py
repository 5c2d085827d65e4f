"""`RoutingPolicy`: the configured policy with its inputs loaded and its learned state kept.

The proxy's router and the simulator's SimProxy hold one; `decide` builds the policy's
`Turn`, calls the policy module's pure `decide`, and keeps what a learning policy hands back
(live's running means) for the next turn - the state lives here, not in the policy.
"""

from __future__ import annotations

from typing import Any

from proxy.live.cluster_view import ClusterView
from proxy.live.predict import StepCosts, TurnState
from proxy.policies import registry
from proxy.policies.base import Inputs, Need, Turn
from proxy.policies.table import DecisionTable
from proxy.shared.vocabulary import Decision, Role, Workload


class RoutingPolicy:
    """The configured policy (`config`: a `proxy.config.policy_config.PolicyConfig`), with its
    inputs loaded once (its module's `inputs` hook: ppd precomputes its table's verdicts)."""

    def __init__(self, config: Any, table: DecisionTable | None = None,
                 costs: StepCosts | None = None) -> None:
        self.spec = registry.get(config.kind)
        needs = self.spec.needs
        if needs.table is Need.REQUIRED and table is None:
            raise ValueError(f"policy {self.spec.name} needs a decision table")
        if needs.costs is Need.REQUIRED and costs is None:
            raise ValueError(f"policy {self.spec.name} needs a step-cost model")
        self.config = config
        # The policy's own hook reads its flags (ppd's weights: its table's verdicts).
        self.inputs: Inputs = (self.spec.inputs(config, table, costs)
                               if self.spec.inputs is not None
                               else Inputs(config, table, costs=costs))
        self.memory = self.spec.remember(config) if self.spec.remember is not None else None

    @property
    def kind(self) -> Any:
        """The configured policy (a `proxy.config.policy_config.Policy`)."""
        return self.config.kind

    @property
    def table(self) -> DecisionTable | None:
        return self.inputs.table

    @property
    def serving_roles(self) -> tuple[tuple[Role, ...], ...]:
        """Sets of roles, any one of which (a usable node of each) serves every turn."""
        return self.spec.roles

    def decide(self, workload: Workload, session_id: str, can_local: bool,
               state: TurnState | None = None, *, replica_home: bool = False,
               can_pd: bool = True, can_readback: bool = False,
               view: ClusterView | None = None) -> Decision:
        """The route of one turn (`state`: the cluster now, read by a policy that needs the
        live view; `replica_home`: the turn continues a conversation whose replica is usable;
        `can_pd`: the pool has a usable P and D - told to a policy that places;
        `can_readback`: the session's D keeps blocks P can read back now; `view`: the cluster
        now, for a policy that needs it)."""
        turn = Turn(workload, session_id, can_local, state, replica_home, can_pd, can_readback,
                    view)
        if self.spec.remember is None:
            decision: Decision = self.spec.decide(turn, self.inputs)
            return decision
        decision, self.memory = self.spec.decide(turn, self.inputs, self.memory)
        return decision

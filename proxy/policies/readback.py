"""`--policy readback`: turn 2+ reads the history's KV back from the session's D (vLLM's
bidirectional NIXL; docs/readback.md): P prefills only the new tokens, D decodes. A turn whose
D keeps no blocks for it (a streamed previous turn, expired, too few matching tokens) goes
P->D with a reason of its own (`proxy.routing.turn_plan.plan_turn`, `proxy.routing.router`)."""

from __future__ import annotations

from proxy.policies.base import Inputs, Needs, Turn, disaggregated_default
from proxy.shared.vocabulary import Decision, Reason, RouteKind

NAME = "readback"
NEEDS = Needs(readback=True)


def decide(turn: Turn, inputs: Inputs) -> Decision:
    """Readback whenever the session's D is usable."""
    return disaggregated_default(turn) or Decision(RouteKind.READBACK, Reason.POLICY)

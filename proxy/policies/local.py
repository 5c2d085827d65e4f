"""`--policy local`: turn 2+ on the session's D, which holds the history (x=1)."""

from __future__ import annotations

from proxy.policies.base import Inputs, Turn, disaggregated_default
from proxy.shared.vocabulary import Decision, Reason, RouteKind

NAME = "local"
LOCAL_SHARE = 1.0  # every turn 2+ that can: the paper's x=1


def decide(turn: Turn, inputs: Inputs) -> Decision:
    """Append-prefill on the session's D whenever it is usable."""
    return disaggregated_default(turn) or Decision(RouteKind.LOCAL, Reason.POLICY)

"""`--policy pd`: every turn P->D (x=0): P prefills the whole history, D decodes."""

from __future__ import annotations

from proxy.policies.base import Inputs, Turn, disaggregated_default
from proxy.shared.vocabulary import Decision, Reason, RouteKind

NAME = "pd"
LOCAL_SHARE = 0.0  # no turn local: the paper's x=0
DEFAULT = True  # `--policy`'s default: P->D, the route that needs no cached state


def decide(turn: Turn, inputs: Inputs) -> Decision:
    """P->D, whatever the turn."""
    return disaggregated_default(turn) or Decision(RouteKind.PD, Reason.POLICY)

"""`--policy replica`: no P; one node (R) does prefill and decode. A P/D pool's nodes idle."""

from __future__ import annotations

from proxy.policies.base import Inputs, Turn
from proxy.shared.vocabulary import Decision, Reason, Role, RouteKind

NAME = "replica"
ROLES = ((Role.REPLICA,),)
IGNORES_FORCING = True  # x-ppd-route names P/D routes, which this pool need not have


def decide(turn: Turn, inputs: Inputs) -> Decision:
    """Every turn on a replica."""
    return Decision(RouteKind.REPLICA, Reason.REPLICA)

"""`--policy vllm-example`: vLLM's own multi-turn disaggregated example proxy - P and D by
round robin, every turn P->D, and a later turn's P reading the history back from the D that
served the previous one.

Source: vllm-project/vllm `examples/disaggregated/disaggregated_serving/
disagg_proxy_multiturn.py` (030ea52, 2026): `itertools.cycle` over the prefill instances and,
separately, over the decode instances, each advanced once per request; a conversation's
`kv_transfer_params` from D's last turn are kept (450 s) and attached to the next turn's P
leg, so P reads the history's KV from that D (vLLM's `bidirectional_kv_xfer`) and then hands
its blocks to the next D of the cycle. ppd's `readback` route is that turn
(docs/readback.md); when D keeps no blocks for it, the turn goes P->D as the example's cache
miss does. The cycles go over the usable nodes in the pool's order (the example has no
health checks); their positions are the policy's learned state (`remember`), so `decide`
stays pure.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from proxy.live.cluster_view import ClusterView, NodeView
from proxy.policies.anchor_nodes import url, usable
from proxy.policies.base import Inputs, Needs, Turn
from proxy.shared.vocabulary import Decision, Reason, Role, RouteKind

NAME = "vllm-example"
NEEDS = Needs(view=True, readback=True)


class Cycles(NamedTuple):
    """How many requests each round robin has served."""

    prefill: int = 0
    decode: int = 0


def remember(config: Any) -> Cycles:
    """Both round robins start at their first node."""
    return Cycles()


def _next(nodes: tuple[NodeView, ...], served: int) -> NodeView | None:
    return nodes[served % len(nodes)] if nodes else None


def decide(turn: Turn, inputs: Inputs, cycles: Cycles) -> tuple[Decision, Cycles]:
    """The next P and the next D; readback from the session's D on turn 2+."""
    view = turn.view or ClusterView(())
    prefill = _next(usable(view, Role.PREFILL), cycles.prefill)
    decode = _next(usable(view, Role.DECODE), cycles.decode)
    moved = Cycles(cycles.prefill + 1, cycles.decode + 1)
    if turn.workload.turn <= 1:
        kind, reason = RouteKind.PD, Reason.TURN1
    elif not turn.can_local:  # no D left to read the history from
        kind, reason = RouteKind.PD, Reason.NO_HOME
    else:
        kind, reason = RouteKind.READBACK, Reason.POLICY
    return Decision(kind, reason, decode=url(decode), prefill=url(prefill)), moved

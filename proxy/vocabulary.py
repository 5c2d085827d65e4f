"""The vocabulary every layer shares: node roles, route kinds, a turn's workload, a decision."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proxy.discretize import Cell


class Role(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    REPLICA = "replica"


class RouteKind(enum.StrEnum):
    """How one turn is served.

    PD: prefill on P, KV shipped to D, decode on D (x=0).
    LOCAL: append-prefill on the session's D, which already holds the history (x=1).
    REPLICA: one node does prefill and decode, no disaggregation.
    READBACK: P reads the history's KV back from the session's D (vLLM's bidirectional NIXL),
      prefills only the new tokens, and hands them to D (docs/readback.md).
    """

    PD = "pd"
    LOCAL = "local"
    REPLICA = "replica"
    READBACK = "readback"


@dataclass(frozen=True, slots=True)
class Workload:
    """What a policy knows about one turn.

    turn: 1-based turn index within the session (1 = a new conversation or branch).
    n_in: new input tokens beyond what D already holds.
    n_ctx: tokens D already holds for this conversation (0 on turn 1).
    n_out: expected output tokens (max_tokens, else a running estimate).
    qps: current load, conversation turns per second over a sliding window.
    """

    turn: int
    n_in: int
    n_ctx: int
    n_out: int
    qps: float


class Reason(enum.StrEnum):
    """Why a route was chosen (a metrics label)."""

    TURN1 = "turn1"
    NO_HOME = "no_home"
    POLICY = "policy"
    DRAW = "draw"
    THRESHOLD = "threshold"
    TABLE = "table"
    MISSING_CELL = "missing_cell"
    FORCED = "forced"
    REPLICA = "replica"
    LIVE = "live"
    LIVE_BLIND = "live_blind"  # live decided without residency: no KV events for the session
    EVICTED = "evicted"
    REPLICA_LIVE = "replica_live"  # live placed the conversation on a replica (hybrid pool)
    REPLICA_HOME = "replica_home"  # a later turn of a conversation live placed on a replica
    # A readback that could not run, served P->D (docs/readback.md): D named no blocks for the
    # session's text (or another worker holds them), they outlived D's TTL, or too few of the
    # new prompt's tokens are the ones D's blocks hold.
    READBACK_MISSING = "readback_missing"
    READBACK_EXPIRED = "readback_expired"
    READBACK_MISMATCH = "readback_mismatch"


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's verdict for one turn, with the reason and (ppd) the table cell used."""

    kind: RouteKind
    reason: Reason
    cell: Cell | None = None

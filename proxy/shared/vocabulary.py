"""The vocabulary every layer shares: node roles, a node, a cluster's layout, route kinds, a
turn's workload, a decision. The proxy, the cluster launcher, the simulator and the emulated
nodes all name roles, nodes and layouts with these."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from proxy.shared.discretize import Cell

# The product's name: its distribution, its command, its directories and keys. One policy is
# spelt the same (`proxy.policies.ppd`); this is the other word.
PRODUCT = "ppd"


class Role(enum.StrEnum):
    """A node's part in the cluster."""

    PREFILL = "prefill"  # P: prefills and hands its KV to a D
    DECODE = "decode"  # D: receives KV from a P, or prefills locally (PPD's append-prefill)
    REPLICA = "replica"  # R: prefill and decode, no transfers

    @property
    def letter(self) -> str:
        """Its letter in a layout's name (`1P2D1R`)."""
        return self.value[0].upper()


@dataclass(frozen=True, slots=True)
class Node:
    """One node as every layer knows it: the base URL its API answers on (without `/v1`) and
    its role. The records of each layer build on it - the proxy's configured nodes
    (`proxy.config.cluster_file.NodeSpec`, validated) and its pool's
    (`proxy.upstream.backends.Backend`, which
    holds one), the launcher's running servers (`profiler.cluster.launcher.Node`), the
    emulated ones (`profiler.emulate.serve.HostedNode`) and the simulator's
    (`profiler.simulator.layout.SimNode`) - so a field every node has is added here."""

    url: str  # exactly as configured or registered (the proxy echoes it in its headers)
    role: Role

    @property
    def base(self) -> str:
        """The URL to append API paths to."""
        return self.url.rstrip("/")


class LayoutError(ValueError):
    """A layout name that does not describe a usable cluster."""


_LAYOUT = re.compile(r"^(?:\d+[PDR])+$", re.IGNORECASE)
_LAYOUT_PART = re.compile(r"(\d+)([PDR])", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Layout:
    """Node counts per role: P/D pairs, replicas alone, or replicas beside P/D (a hybrid)."""

    prefill: int = 0
    decode: int = 0
    replica: int = 0

    @classmethod
    def parse(cls, name: str) -> Layout:
        """`1P3D` -> Layout(1, 3, 0), `1R1P2D` -> Layout(1, 2, 1): the parts in any order, each
        once and of at least one node, case-insensitive; a clear error for anything else."""
        text = name.strip()
        parts = [(letter.upper(), int(count)) for count, letter in _LAYOUT_PART.findall(text)]
        counts = dict(parts)
        if _LAYOUT.match(text) is None or len(counts) != len(parts):
            raise LayoutError(f"bad layout {name!r}: use counts of P, D and R, each once, "
                              "e.g. 1P3D, 2P2D, 4R, 1R1P2D")
        if any(count < 1 for count in counts.values()):
            raise LayoutError(f"bad layout {name!r}: each part names at least one node")
        layout = cls(*(counts.get(role.letter, 0) for role in Role))
        if (layout.prefill > 0) != (layout.decode > 0):
            raise LayoutError(f"bad layout {name!r}: prefill and decode nodes come together "
                              "(a P needs a D to hand its KV to, and a D needs a P for turn 1)")
        return layout

    @property
    def name(self) -> str:
        """`1P2D`, `2R`, and for a hybrid P, D, R in that order (`1P2D1R`)."""
        return "".join(f"{count}{role.letter}" for role, count in self.counts() if count)

    def __str__(self) -> str:
        return self.name

    @property
    def size(self) -> int:
        return self.prefill + self.decode + self.replica

    @property
    def disaggregated(self) -> bool:
        """Whether the layout has P/D pairs."""
        return self.prefill > 0

    @property
    def roles(self) -> list[Role]:
        """One role per node: prefill nodes, then decode, then replicas."""
        return [role for role, count in self.counts() for _ in range(count)]

    def counts(self) -> tuple[tuple[Role, int], ...]:
        """(role, count) in P, D, R order."""
        return ((Role.PREFILL, self.prefill), (Role.DECODE, self.decode),
                (Role.REPLICA, self.replica))


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
    READBACK_DECLINED = "readback_declined"  # P refused or failed the read: P->D on that P
    # A node the policy named (`Decision.decode` / `prefill`) was not usable: the turn took
    # the default pick instead (the session's node, else the least busy).
    NODE_UNUSABLE = "node_unusable"


@dataclass(frozen=True, slots=True)
class RouteCost:
    """What a policy weighed for one route: the TTFT (and TPOT) it predicted (live) or its
    table measured (ppd), in ms; the x-ppd-costs header shows them (`proxy.shared.explain`)."""

    route: RouteKind
    ttft_ms: float
    tpot_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's verdict for one turn, with the reason and (ppd) the table cell used, and the
    nodes it names (URLs from `Turn.view`): `decode` answers the client (the D of a P->D or
    readback turn, or the replica), `prefill` is the P of a P->D or readback turn. None: the
    default pick - the session's own node if usable, else the least busy. A named node that
    is not usable when the turn is planned gets the default pick, reason NODE_UNUSABLE; a
    local turn always runs on the session's D (a `decode` naming another is not applied)."""

    kind: RouteKind
    reason: Reason
    cell: Cell | None = None
    decode: str | None = None
    prefill: str | None = None
    # The routes weighed, for x-ppd-costs (live, ppd): an explanation, not part of the
    # verdict, so two decisions of the same route, reason, cell and nodes are equal.
    costs: tuple[RouteCost, ...] = field(default=(), compare=False)

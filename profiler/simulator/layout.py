"""Cluster layouts by name: `1P3D`, `2P2D`, `3P1D`, `4R`, hybrids like `1P2D1R` (= `1R1P2D`).

A layout is a count per role in P, D, R order; the node names (`p0`, `d1`, `r0`) double as the
backend URLs the proxy's pool keys nodes by, so a simulated record's `x-ppd-decode` column
names the node that served it just as a real run's does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.vocabulary import Role

_PART = re.compile(r"(\d+)([PDR])", re.IGNORECASE)
_LAYOUT = re.compile(r"^(?:\d+[PDR])+$", re.IGNORECASE)
_PREFIX = {Role.PREFILL: "p", Role.DECODE: "d", Role.REPLICA: "r"}


class LayoutError(ValueError):
    """A layout name that does not describe a usable cluster."""


@dataclass(frozen=True, slots=True)
class SimNode:
    """One node of a layout: its name (also its URL in the pool) and role."""

    name: str
    role: Role

    @property
    def url(self) -> str:
        return f"http://{self.name}.sim"


@dataclass(frozen=True, slots=True)
class Layout:
    """How many P, D and R nodes a cluster has."""

    prefill: int
    decode: int
    replica: int

    @classmethod
    def parse(cls, name: str) -> Layout:
        """`1P3D` -> Layout(1, 3, 0), `1R1P2D` -> Layout(1, 2, 1) (the parts in any order,
        each once); a clear error for anything else."""
        text = name.strip()
        parts = [(letter.upper(), int(count)) for count, letter in _PART.findall(text)]
        counts = dict(parts)
        if _LAYOUT.match(text) is None or len(counts) != len(parts):
            raise LayoutError(f"bad layout {name!r}: use counts of P, D and R, each once, "
                              "e.g. 1P3D, 2P2D, 4R, 1R1P2D")
        p, d, r = (counts.get(letter, 0) for letter in "PDR")
        layout = cls(p, d, r)
        if (p > 0) != (d > 0):
            raise LayoutError(f"layout {name!r}: prefill and decode nodes come together "
                              "(a P needs a D to hand its KV to, and a D needs a P for turn 1)")
        if p + d + r == 0:
            raise LayoutError(f"layout {name!r} has no node")
        return layout

    @property
    def name(self) -> str:
        parts = [(self.prefill, "P"), (self.decode, "D"), (self.replica, "R")]
        return "".join(f"{count}{letter}" for count, letter in parts if count)

    @property
    def disaggregated(self) -> bool:
        """Whether the layout has P/D pairs (policies other than replica need them)."""
        return self.prefill > 0

    def nodes(self) -> list[SimNode]:
        """Every node, P first, then D, then R."""
        counts = ((Role.PREFILL, self.prefill), (Role.DECODE, self.decode),
                  (Role.REPLICA, self.replica))
        return [SimNode(f"{_PREFIX[role]}{i}", role) for role, count in counts
                for i in range(count)]

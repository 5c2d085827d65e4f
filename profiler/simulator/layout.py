"""The simulator's nodes of a layout (`proxy.vocabulary.Layout`): `1P3D`, `4R`, `1P2D1R`.

The node names (`p0`, `d1`, `r0`) double as the backend URLs the proxy's pool keys nodes by,
so a simulated record's `x-ppd-decode` column names the node that served it just as a real
run's does.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.vocabulary import Layout, Role


@dataclass(frozen=True, slots=True)
class SimNode:
    """One node of a layout: its name (also its URL in the pool) and role."""

    name: str
    role: Role

    @property
    def url(self) -> str:
        return f"http://{self.name}.sim"


def sim_nodes(layout: Layout) -> list[SimNode]:
    """Every node, P first, then D, then R, numbered per role (`p0`, `d0`, `d1`)."""
    return [SimNode(f"{role.letter.lower()}{i}", role) for role, count in layout.counts()
            for i in range(count)]

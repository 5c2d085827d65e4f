"""The simulator's nodes of a layout (`proxy.shared.vocabulary.Layout`): `1P3D`, `4R`, `1P2D1R`.

The node names (`p0`, `d1`, `r0`) double as the backend URLs the proxy's pool keys nodes by,
so a simulated record's `x-ppd-decode` column names the node that served it just as a real
run's does.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.shared.vocabulary import Layout, Node, Role


@dataclass(frozen=True, slots=True)
class SimNode(Node):
    """One node of a layout: its URL in the pool (from its name), role and name."""

    name: str

    @classmethod
    def named(cls, name: str, role: Role) -> SimNode:
        return cls(f"http://{name}.sim", role, name)


def sim_nodes(layout: Layout) -> list[SimNode]:
    """Every node, P first, then D, then R, numbered per role (`p0`, `d0`, `d1`)."""
    return [SimNode.named(f"{role.letter.lower()}{i}", role) for role, count in layout.counts()
            for i in range(count)]

"""Layout names."""

from __future__ import annotations

import pytest

from profiler.simulator.layout import Layout, LayoutError
from proxy.vocabulary import Role


@pytest.mark.parametrize(("name", "counts"), [
    ("1P3D", (1, 3, 0)), ("2p2d", (2, 2, 0)), ("4R", (0, 0, 4)), ("1P2D1R", (1, 2, 1)),
    ("1D1P", (1, 1, 0)), ("2R1P1D", (1, 1, 2)),
])
def test_parse(name: str, counts: tuple[int, int, int]) -> None:
    layout = Layout.parse(name)
    assert (layout.prefill, layout.decode, layout.replica) == counts
    assert Layout.parse(layout.name) == layout


def test_nodes_are_named_by_role() -> None:
    nodes = Layout.parse("1P2D").nodes()
    assert [(n.name, n.role) for n in nodes] == [
        ("p0", Role.PREFILL), ("d0", Role.DECODE), ("d1", Role.DECODE)]
    assert nodes[0].url == "http://p0.sim"


@pytest.mark.parametrize("name", ["", "3P", "2D", "P3D", "1P1P1D", "1R2D", "x", "0P0D"])
def test_bad_layouts_are_named(name: str) -> None:
    with pytest.raises(LayoutError, match="layout"):
        Layout.parse(name)

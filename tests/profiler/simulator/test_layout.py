"""Layout names."""

from __future__ import annotations

import pytest

from profiler.cluster.plan import ClusterError, parse_layout
from profiler.simulator.layout import sim_nodes
from proxy.shared.vocabulary import Layout, LayoutError, Role


@pytest.mark.parametrize(("name", "counts"), [
    ("1P3D", (1, 3, 0)), ("2p2d", (2, 2, 0)), ("4R", (0, 0, 4)), ("1P2D1R", (1, 2, 1)),
    ("1D1P", (1, 1, 0)), ("2R1P1D", (1, 1, 2)),
])
def test_parse(name: str, counts: tuple[int, int, int]) -> None:
    layout = Layout.parse(name)
    assert (layout.prefill, layout.decode, layout.replica) == counts
    assert Layout.parse(layout.name) == layout


def test_nodes_are_named_by_role() -> None:
    nodes = sim_nodes(Layout.parse("1P2D"))
    assert [(n.name, n.role) for n in nodes] == [
        ("p0", Role.PREFILL), ("d0", Role.DECODE), ("d1", Role.DECODE)]
    assert nodes[0].url == "http://p0.sim"


@pytest.mark.parametrize("name", ["", "3P", "2D", "P3D", "1P1P1D", "1R2D", "x", "0P0D",
                                  "0P0D2R", "1P1D0R"])
def test_bad_layouts_are_named_by_the_simulator_and_the_cluster_alike(name: str) -> None:
    with pytest.raises(LayoutError, match="layout"):
        Layout.parse(name)
    with pytest.raises(ClusterError, match="bad layout"):
        parse_layout(name)


def test_the_cluster_takes_the_simulators_layouts_up_to_one_hosts_nodes() -> None:
    assert parse_layout("1R1P2D") == Layout.parse("1P2D1R") == Layout(1, 2, 1)
    assert str(parse_layout("2r")) == "2R"
    with pytest.raises(ClusterError, match="at most 16 nodes"):
        parse_layout("9P9D")

"""One node record (`proxy.shared.vocabulary.Node`: URL and role) under every layer's own: the
proxy's
configured nodes and pool, the launcher's, the emulator's and the simulator's running nodes."""

from __future__ import annotations

import dataclasses

import pytest

from profiler.cluster.launcher import LaunchedNode
from profiler.emulate.serve import HostedNode
from profiler.simulator.layout import SimNode, sim_nodes
from proxy.config.cluster_file import NodeSpec
from proxy.config.config_files import ConfigError
from proxy.shared.vocabulary import Layout, Node, Role
from proxy.upstream.backends import Backend, BackendPool


@pytest.mark.parametrize("record", [NodeSpec, LaunchedNode, HostedNode, SimNode])
def test_each_layers_node_is_a_node(record: type) -> None:
    assert issubclass(record, Node)
    names = [f.name for f in dataclasses.fields(record)]
    assert names[:2] == ["url", "role"]  # the shared fields, declared once


def test_the_pool_holds_each_node_as_a_node() -> None:
    nodes = [SimNode.named("p0", Role.PREFILL), NodeSpec("http://127.0.0.1:8101/", Role.DECODE)]
    pool = BackendPool(nodes)
    backend = pool.get("http://127.0.0.1:8101/")
    assert isinstance(backend, Backend) and backend.node == Node("http://127.0.0.1:8101/",
                                                                 Role.DECODE)
    assert (backend.url, backend.role, backend.base) == (
        "http://127.0.0.1:8101/", Role.DECODE, "http://127.0.0.1:8101")
    sim = pool.get("http://p0.sim")
    assert sim is not None and sim.role is Role.PREFILL


def test_the_simulators_nodes_keep_their_names_and_urls() -> None:
    assert [(n.name, n.url, n.role) for n in sim_nodes(Layout.parse("1P1D"))] == [
        ("p0", "http://p0.sim", Role.PREFILL), ("d0", "http://d0.sim", Role.DECODE)]


def test_a_configured_node_is_still_checked() -> None:
    with pytest.raises(ConfigError, match="ends in /v1"):
        NodeSpec("http://127.0.0.1:8100/v1", Role.PREFILL)

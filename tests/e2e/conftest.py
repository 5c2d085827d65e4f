"""E2E fixtures: the tiny model (built once per session) and real vLLM clusters (once per module).

Every test here runs against real vLLM servers on the CPU and carries the `vllm` marker
(`make test-fast` deselects them). Clusters use fixed ports from 18100 upward, one block per
layout, so they never collide with the OS-chosen ports of other tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.cluster.launcher import Cluster, default_cores, start_cluster
from profiler.cluster.plan import ClusterConfig, parse_layout
from profiler.models.prepare import prepare_model

E2E_DIR = Path(__file__).parent
BASE_PORTS = {"1P1D": 18100, "1P2D": 18110}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, built in a temporary directory (hermetic; about 3 s)."""
    return prepare_model("tiny", tmp_path_factory.mktemp("models") / "tiny")


def _cluster(layout: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Cluster]:
    config = ClusterConfig(
        model=str(tiny_model), layout=parse_layout(layout),
        state_dir=tmp_path_factory.mktemp(f"cluster-{layout}"), base_port=BASE_PORTS[layout],
        cores=default_cores(), startup_timeout_s=420.0,
    )
    with start_cluster(config) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def cluster_1p1d(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Cluster]:
    yield from _cluster("1P1D", tiny_model, tmp_path_factory)


@pytest.fixture(scope="module")
def cluster_1p2d(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Cluster]:
    yield from _cluster("1P2D", tiny_model, tmp_path_factory)

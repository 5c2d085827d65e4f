"""E2E fixtures: the tiny model (built once per session) and real vLLM clusters (once per module).

Every test here runs against real vLLM servers on the CPU and carries the `vllm` marker
(`make test-fast` deselects them). Clusters move KV with NIXL (the launcher's default; one
module keeps ExampleConnector) on ports found free at start-up. Starting a cluster costs
1-6 minutes here, so each one serves a whole module; the 1P1D one serves test_1p1d*.py (run one
after the other) and stops after the last test that uses it, not at the end of the session: a
NIXL node's progress thread polls even when idle and would slow every later cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler.cluster.launcher import Cluster
from profiler.models.prepare import prepare_model
from tests.e2e.support import STARTUP_TIMEOUT_S, start_e2e_cluster

E2E_DIR = Path(__file__).parent
# pytest-timeout counts a test's fixture setup: the first test of a module waits for its
# cluster, and a start that hangs is tried once more (`start_e2e_cluster`). Both attempts
# and the test itself (the ini's 600 s) must fit, or the retry is cut short (seen once: a
# node hung in NIXL's init for the whole first attempt, the timeout killed the second).
E2E_TEST_TIMEOUT_S = 2 * STARTUP_TIMEOUT_S + 600
SHARED_1P1D = "cluster_1p1d"
_running_1p1d: list[Cluster] = []
_last_1p1d_user: list[str] = []  # nodeid of the last collected test that uses it


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.vllm)
            item.add_marker(pytest.mark.timeout(E2E_TEST_TIMEOUT_S))
    users = [i.nodeid for i in items if SHARED_1P1D in getattr(i, "fixturenames", ())]
    _last_1p1d_user[:] = users[-1:]


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _running_1p1d and [item.nodeid] == _last_1p1d_user:
        _running_1p1d.pop().stop()  # the fixture's own stop at session end finds it stopped


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, built in a temporary directory (hermetic; about 3 s)."""
    return prepare_model("tiny", tmp_path_factory.mktemp("models") / "tiny")


def _cluster(layout: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Cluster]:
    with start_e2e_cluster(layout, tiny_model, tmp_path_factory) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def cluster_1p1d(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Cluster]:
    with start_e2e_cluster("1P1D", tiny_model, tmp_path_factory) as cluster:
        _running_1p1d.append(cluster)
        yield cluster


@pytest.fixture(scope="module")
def cluster_1p2d(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Cluster]:
    yield from _cluster("1P2D", tiny_model, tmp_path_factory)

"""Scale-out configuration, the store choice, and merged worker metrics (no processes)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from proxy.config.config_files import ConfigError
from proxy.config.settings import config_from_args
from proxy.observability.worker_metrics import WorkerMetrics
from proxy.sessions.open_store import open_store
from proxy.sessions.redis_store import RedisStore
from proxy.sessions.store import MemoryStore

NODES = ["--prefill", "http://p:1", "--decode", "http://d:1"]


@pytest.mark.parametrize(("argv", "fragment"), [
    ([*NODES, "--workers", "0"], "--workers must be >= 1"),
    ([*NODES, "--session-store", "mysql://x"], "memory or redis://"),
    ([*NODES, "--workers", "2", "--session-store", "redis://h:6379/0", "--discovery",
      "tcp://127.0.0.1:5555"], "cannot be combined with --discovery"),
])
def test_invalid_scale_out_configurations(argv: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        config_from_args(argv)


def test_workers_with_a_redis_store_are_accepted() -> None:
    config = config_from_args([*NODES, "--workers", "4", "--session-store",
                               "redis://127.0.0.1:6379/2"])
    assert (config.workers, config.session_store) == (4, "redis://127.0.0.1:6379/2")


def test_workers_without_a_store_are_accepted_the_supervisor_embeds_one() -> None:
    config = config_from_args([*NODES, "--workers", "2"])
    assert (config.workers, config.session_store) == (2, "memory")


def test_open_store_picks_the_implementation() -> None:
    assert isinstance(open_store("memory", 60, 10, time.monotonic), MemoryStore)
    store = open_store("redis://127.0.0.1:1/0", 60, 10, time.monotonic)
    assert isinstance(store, RedisStore) and store.shared and not store.up  # not started


def _exposition(requests: float, up: float) -> bytes:
    registry = CollectorRegistry()
    Counter("ppd_responses", "r", ["status"], registry=registry).labels("200").inc(requests)
    Gauge("ppd_session_store_up", "u", registry=registry).set(up)
    return generate_latest(registry)


def test_any_worker_answers_metrics_for_every_worker_with_a_worker_label(
        tmp_path: Path) -> None:
    first = WorkerMetrics(tmp_path, 0, lambda: _exposition(3, 1))
    second = WorkerMetrics(tmp_path, 1, lambda: _exposition(5, 0))
    second.publish()
    text = first.exposition().decode()
    assert 'ppd_responses_total{status="200",worker="0"} 3.0' in text
    assert 'ppd_responses_total{status="200",worker="1"} 5.0' in text
    assert 'ppd_session_store_up{worker="0"} 1.0' in text
    assert 'ppd_session_store_up{worker="1"} 0.0' in text
    assert text.count("# TYPE ppd_responses_total counter") == 1  # one family, both workers
    second.retire()
    assert 'worker="1"' not in first.exposition().decode()

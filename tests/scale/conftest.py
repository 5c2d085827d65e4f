"""A real Redis server per test (loopback port, no persistence)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A running redis-server, stopped after the test."""
    with RedisServer(tmp_path) as server:
        yield server

"""`ppd proxy --workers N` with no --session-store: the supervisor runs a redis-server of its
own on a Unix socket, the workers share sessions through it, and it goes away with the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil
import pytest
import redis

from proxy.config.config_files import ConfigError
from proxy.serving.embedded_store import EmbeddedRedis
from tests.fakes.fake_vllm import FakeVLLM
from tests.fakes.redis_server import free_port
from tests.scale.conversations import (
    Conversations,
    check_every_later_turn_ran_locally_on_its_d,
    crossings,
)
from tests.scale.processes import ppd_proxy
from tests.scale.test_scale_out import store_up

CONVERSATIONS = 60
TURNS = 3


def test_the_embedded_server_answers_on_a_private_socket_and_stops(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    store = EmbeddedRedis(tmp_path).start()
    try:
        assert store.alive() and store.url == f"unix://{tmp_path}/sessions.sock?db=0"
        assert stat.S_IMODE(store.socket_path.stat().st_mode) == 0o700
        client = redis.Redis.from_url(store.url)
        assert client.set("k", "v") and client.get("k") == b"v"
        client.close()
    finally:
        store.stop()
    assert not store.alive() and not store.socket_path.exists()


def test_a_store_that_cannot_start_says_why(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.serving.embedded_store.redis_server_binary", lambda: "/bin/false")
    with pytest.raises(ConfigError, match="embedded session store .* exited"):
        EmbeddedRedis(tmp_path).start()


@pytest.fixture
async def nodes() -> AsyncIterator[dict[str, FakeVLLM]]:
    """One P and two D fakes."""
    async with contextlib.AsyncExitStack() as stack:
        yield {name: await stack.enter_async_context(FakeVLLM(name))
               for name in ("p1", "d1", "d2")}


def _embedded_servers(proxy_pid: int) -> list[psutil.Process]:
    return [child for child in psutil.Process(proxy_pid).children()
            if "redis-server" in child.name()]


async def test_workers_share_sessions_through_the_embedded_store_with_no_setup(
        tmp_path: Path, nodes: dict[str, FakeVLLM]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--policy", "local", "--prefill", nodes["p1"].url, "--decode", nodes["d1"].url,
            "--decode", nodes["d2"].url, "--port", str(port), "--health-interval", "60",
            "--workers", "2"]  # and no --session-store
    async with ppd_proxy(args, tmp_path / "proxy.log") as proxy:
        await proxy.wait_http(f"{url}/health", want_workers=2)
        assert proxy.process is not None
        (server,) = _embedded_servers(proxy.process.pid)
        convs = Conversations(url, CONVERSATIONS)
        for k in range(1, TURNS + 1):
            await convs.round(k)
        async with httpx.AsyncClient() as client:
            metrics = (await client.get(f"{url}/metrics")).text
        check_every_later_turn_ran_locally_on_its_d(convs, [nodes["p1"]],
                                                    [nodes["d1"], nodes["d2"]])
        moved, total = crossings(convs)
        assert total == CONVERSATIONS * (TURNS - 1)
        assert moved >= total // 4, f"only {moved} of {total} turns changed worker"
        assert store_up(metrics) == {"0": 1.0, "1": 1.0}
        # A store that dies is restarted; the workers reconnect and keep serving.
        os.kill(server.pid, signal.SIGKILL)
        for _ in range(100):
            restarted = _embedded_servers(proxy.process.pid)
            if restarted and restarted[0].pid != server.pid:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the embedded store was not restarted")
        later = Conversations(url, 10)
        await later.round(1)
        await later.round(2)
        assert {t.status for turns in later.turns.values() for t in turns} == {200}
    assert "embedded redis-server" in proxy.output()
    assert "embedded session store exited; restarting it" in proxy.output()
    assert not psutil.pid_exists(restarted[0].pid) or \
        psutil.Process(restarted[0].pid).status() == psutil.STATUS_ZOMBIE

"""Scale-out end to end, with real processes: `ppd proxy --workers 2`, and two replicas behind
haproxy, on one real Redis; fake vLLM nodes record where every turn ran."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from proxy.serving.workers import CRASH_WINDOW_S
from tests.fakes.fake_vllm import FakeVLLM
from tests.fakes.redis_server import RedisServer, free_port
from tests.scale.conversations import (
    Conversations,
    check_every_later_turn_ran_locally_on_its_d,
    crossings,
)
from tests.scale.processes import haproxy, ppd_proxy

CONVERSATIONS = 200
TURNS = 4


@pytest.fixture
async def nodes() -> AsyncIterator[dict[str, FakeVLLM]]:
    """One P and two D fakes."""
    async with contextlib.AsyncExitStack() as stack:
        yield {name: await stack.enter_async_context(FakeVLLM(name))
               for name in ("p1", "d1", "d2")}


def proxy_args(nodes: dict[str, FakeVLLM], store: str, port: int, *extra: str) -> list[str]:
    return ["--policy", "local", "--prefill", nodes["p1"].url, "--decode", nodes["d1"].url,
            "--decode", nodes["d2"].url, "--session-store", store, "--port", str(port),
            "--health-interval", "60", *extra]


def store_up(metrics: str) -> dict[str, float]:
    """ppd_session_store_up by worker, from a /metrics text."""
    out = {}
    for line in metrics.splitlines():
        if line.startswith("ppd_session_store_up{"):
            labels, value = line.rsplit(" ", 1)
            worker = labels.split('worker="')[1].split('"')[0] if 'worker="' in labels else "-"
            out[worker] = float(value)
    return out


async def test_two_workers_on_one_port_continue_every_conversation_locally(
        tmp_path: Path, redis_server: RedisServer, nodes: dict[str, FakeVLLM]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = proxy_args(nodes, redis_server.url, port, "--workers", "2")
    async with ppd_proxy(args, tmp_path / "proxy.log") as proxy:
        await proxy.wait_http(f"{url}/health", want_workers=2)
        started = asyncio.get_running_loop().time()
        convs = Conversations(url, CONVERSATIONS)
        for k in range(1, TURNS + 1):
            await convs.round(k)
        async with httpx.AsyncClient() as client:
            metrics = (await client.get(f"{url}/metrics")).text
        check_every_later_turn_ran_locally_on_its_d(convs, [nodes["p1"]],
                                                    [nodes["d1"], nodes["d2"]])
        # A worker that dies is restarted; the other serves meanwhile.
        workers = proxy.workers()
        assert len(workers) == 2
        # Past the supervisor's crash window, or the death reads as a broken start-up
        # (the rounds above can take less than that).
        await asyncio.sleep(max(0.0, started + CRASH_WINDOW_S + 0.5
                                - asyncio.get_running_loop().time()))
        os.kill(workers[0], signal.SIGKILL)
        await asyncio.sleep(0.5)
        meanwhile = Conversations(url, 20)
        await meanwhile.round(1)
        await proxy.wait_http(f"{url}/health", want_workers=2)
        restarted = proxy.workers()
    assert {t.status for turns in meanwhile.turns.values() for t in turns} == {200}
    assert len(restarted) == 2 and workers[0] not in restarted
    assert "worker 0 exited with code -9; restarting it" in proxy.output()
    moved, total = crossings(convs)
    assert total == CONVERSATIONS * (TURNS - 1)
    assert moved >= total // 4, f"only {moved} of {total} turns changed worker"
    # One scrape covers both workers, each sample labelled with its worker.
    assert store_up(metrics) == {"0": 1.0, "1": 1.0}
    assert 'ppd_responses_total{status="200",worker="0"}' in metrics


async def test_two_replicas_behind_haproxy_continue_every_conversation_locally(
        tmp_path: Path, redis_server: RedisServer, nodes: dict[str, FakeVLLM]) -> None:
    ports = [free_port(), free_port(), free_port()]
    lb = f"http://127.0.0.1:{ports[0]}"
    replicas = [f"127.0.0.1:{p}" for p in ports[1:]]
    async with contextlib.AsyncExitStack() as stack:
        for i, port in enumerate(ports[1:]):
            replica = await stack.enter_async_context(ppd_proxy(
                proxy_args(nodes, redis_server.url, port), tmp_path / f"replica{i}.log"))
            await replica.wait_http(f"http://127.0.0.1:{port}/health")
        balancer = await stack.enter_async_context(
            haproxy(f"127.0.0.1:{ports[0]}", replicas, tmp_path / "haproxy.log"))
        await balancer.wait_http(f"{lb}/health")
        convs = Conversations(lb, CONVERSATIONS)
        async with httpx.AsyncClient() as client:
            for k in range(1, TURNS + 1):
                await convs.round(k)
                await client.get(f"{lb}/health")  # one extra request: round-robin shifts by one
    check_every_later_turn_ran_locally_on_its_d(convs, [nodes["p1"]], [nodes["d1"], nodes["d2"]])
    served = {t.headers.get("x-ppd-replica") for turns in convs.turns.values() for t in turns}
    assert served == {"ppd1", "ppd2"}
    moved, total = crossings(convs)
    assert moved >= total // 4, f"only {moved} of {total} turns changed replica"

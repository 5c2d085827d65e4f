"""Losing Redis under `ppd proxy --workers 2`: every request still succeeds (P->D), with one
log line per worker and ppd_session_store_up 0; local routing resumes once Redis is back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.fakes.fake_vllm import FakeVLLM
from tests.fakes.redis_server import RedisServer, free_port
from tests.scale.conversations import Conversations
from tests.scale.processes import ppd_proxy
from tests.scale.test_scale_out import nodes, proxy_args, store_up  # noqa: F401 (fixture)

# The target: local routing resumes within 5 s of the store coming back.
RESUME_WITHIN_S = 5.0


async def test_redis_stopped_mid_run_degrades_to_pd_and_recovers(
        tmp_path: Path, redis_server: RedisServer, nodes: dict[str, FakeVLLM]) -> None:  # noqa: F811
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "proxy.log"
    async with ppd_proxy(proxy_args(nodes, redis_server.url, port, "--workers", "2"),
                         log) as proxy, httpx.AsyncClient(base_url=url) as client:
        await proxy.wait_http(f"{url}/health", want_workers=2)
        convs = Conversations(url, 40)
        await convs.round(1)
        before = await convs.round(2)
        assert {t.route for t in before} == {"local"}

        redis_server.stop()
        await _metrics_when(client, {"0": 0.0, "1": 0.0})  # both noticed
        down = [*await convs.round(3), *await convs.round(4)]

        redis_server.start()  # same port, empty
        back = time.monotonic()
        resumed_after = None
        for i in range(1000, 1400):
            await convs.round(1, [i])
            [second] = await convs.round(2, [i])
            if second.route == "local":
                resumed_after = time.monotonic() - back
                break
        await _metrics_when(client, {"0": 1.0, "1": 1.0})  # both are back
        await convs.round(5)
        after = await convs.round(6)

    every = [t for turns in convs.turns.values() for t in turns]
    assert {t.status for t in every} == {200}  # not one request failed
    assert {(t.route, t.headers["x-ppd-turn"]) for t in down} == {("pd", "1")}
    assert resumed_after is not None and resumed_after <= RESUME_WITHIN_S, resumed_after
    assert {t.route for t in after} == {"local"}
    output = proxy.output()
    assert output.count("unreachable") == 2, output  # one line per worker, not per request
    assert output.count("is back: sessions are shared again") == 2, output


async def _metrics_when(client: httpx.AsyncClient, up: dict[str, float]) -> str:
    """/metrics once ppd_session_store_up per worker reads `up` (each worker publishes its
    metrics every second; its probe looks at the store every 0.5 s)."""
    text = ""
    for _ in range(100):
        text = (await client.get("/metrics")).text
        if store_up(text) == up:
            return text
        await asyncio.sleep(0.1)
    raise AssertionError(f"ppd_session_store_up never became {up}:\n{text}")

"""`ppd proxy --workers 2` on one Redis: each worker continues the responses the other one
stored (real processes; each turn on a new connection, so the kernel spreads them)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.fake_vllm import FakeVLLM
from tests.fakes.redis_server import RedisServer, free_port
from tests.scale.processes import ppd_proxy

CHAINS = 24
TURNS = 4


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path) as server:
        yield server


@pytest.fixture
async def nodes() -> AsyncIterator[dict[str, FakeVLLM]]:
    async with contextlib.AsyncExitStack() as stack:
        yield {name: await stack.enter_async_context(FakeVLLM(name)) for name in ("p1", "d1")}


async def _turn(url: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(timeout=20) as client:  # a new connection: any worker
        return await client.post(f"{url}/v1/responses", json=body)


async def test_two_workers_continue_each_others_responses(
        tmp_path: Path, redis_server: RedisServer, nodes: dict[str, FakeVLLM]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--policy", "local", "--prefill", nodes["p1"].url, "--decode", nodes["d1"].url,
            "--session-store", redis_server.url, "--port", str(port), "--health-interval",
            "60", "--workers", "2"]
    async with ppd_proxy(args, tmp_path / "proxy.log") as proxy:
        await proxy.wait_http(f"{url}/health", want_workers=2)
        previous: list[str | None] = [None] * CHAINS
        workers: list[list[str]] = [[] for _ in range(CHAINS)]
        for n in range(1, TURNS + 1):
            answers = await asyncio.gather(*(_turn(url, {
                "model": "fake-model", "input": f"chain {c} turn {n}",
                **({"previous_response_id": previous[c]} if previous[c] else {})})
                for c in range(CHAINS)))
            for c, answer in enumerate(answers):
                assert answer.status_code == 200, answer.text
                assert answer.headers["x-ppd-turn"] == str(n)
                assert answer.headers["x-ppd-route"] == ("pd" if n == 1 else "local")
                previous[c] = answer.json()["id"]
                workers[c].append(answer.headers["x-ppd-worker"])
    moved = sum(a != b for chain in workers for a, b in zip(chain, chain[1:], strict=False))
    assert moved >= CHAINS * (TURNS - 1) // 4, f"only {moved} turns changed worker"
    assert len(nodes["p1"].completions) == CHAINS  # P saw turn 1 only

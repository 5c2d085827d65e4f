"""The benchmark's peers (benchmarks/proxy_overhead/peers.py) start and relay over the fakes.

A smoke test, not a timing: the vLLM project's Rust router, in its P/D mode, sends the fake P a
P leg and the fake D P's kv_transfer_params, and streams D's bytes back unchanged; in its plain
mode it relays to D alone. The fakes here record what they were sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from benchmarks.proxy_overhead import runner
from benchmarks.proxy_overhead.backend import build_app, prefill_answer, stream_events

TOKENS = 4


class RecordingFakes:
    """The benchmark's fake P and D (backend.py's app) on two ports, in a background thread,
    recording every completion request body per port."""

    def __init__(self) -> None:
        self.bodies: dict[int, list[dict[str, Any]]] = {}
        self.ports: list[int] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete,
                                        args=(self._serve(),), daemon=True)

    async def _serve(self) -> None:
        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.method == "POST":
                self.bodies.setdefault(request.url.port or 0, []).append(
                    json.loads(await request.read()))
            return await handler(request)

        app = build_app(TOKENS)
        app.middlewares.append(record)
        site_runner = web.AppRunner(app, access_log=None)
        await site_runner.setup()
        for _ in range(2):
            port = runner.free_port()
            await web.TCPSite(site_runner, "127.0.0.1", port).start()
            self.ports.append(port)
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await site_runner.cleanup()

    def __enter__(self) -> RecordingFakes:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}"


@pytest.fixture
def fakes() -> Iterator[RecordingFakes]:
    with RecordingFakes() as running:
        yield running


def _streamed_chat(url: str) -> bytes:
    body = {"model": "bench-model", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": TOKENS, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as reply:
        assert reply.status_code == 200
        return b"".join(reply.iter_bytes())


def test_vllm_router_pd_mode_runs_the_p_leg_and_streams_d(fakes: RecordingFakes) -> None:
    with runner.peer("vllm-router", fakes.url(0), fakes.url(1)) as (url, pid):
        assert pid > 0
        streamed = _streamed_chat(url)
    assert streamed == b"".join(stream_events(TOKENS, usage=False))
    (p_leg,) = fakes.bodies[fakes.ports[0]]
    (d_leg,) = fakes.bodies[fakes.ports[1]]
    assert p_leg["max_tokens"] == 1 and p_leg["stream"] is False
    assert p_leg["kv_transfer_params"]["do_remote_decode"] is True
    # D gets exactly what P answered, so the fake's P/D exchange is what vLLM's would be.
    assert d_leg["kv_transfer_params"] == json.loads(prefill_answer())["kv_transfer_params"]
    assert d_leg["stream"] is True and d_leg["max_tokens"] == TOKENS


def test_vllm_router_plain_mode_relays_to_d_alone(fakes: RecordingFakes) -> None:
    with runner.peer("vllm-router-d", fakes.url(0), fakes.url(1)) as (url, _):
        streamed = _streamed_chat(url)
    assert streamed == b"".join(stream_events(TOKENS, usage=False))
    assert fakes.ports[0] not in fakes.bodies
    (d_leg,) = fakes.bodies[fakes.ports[1]]
    assert "kv_transfer_params" not in d_leg

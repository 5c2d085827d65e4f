"""The Responses API's proxy overhead against chat completions, same run (issue #44 item 5).

    python -m benchmarks --only responses [--requests N]

Rows, each a turn 2 sent through one in-process proxy (policy local, so the same route: one
D leg) to in-process fake vLLM nodes, timed whole (non-streamed) and streamed (to the last
byte):
- direct: the same chat body straight to the fake D (the floor);
- chat completions: the client sends the whole history (`x-session-id`);
- Responses: the client sends only the new text and `previous_response_id`; the proxy reads
  the chain from its store, builds the chat body, routes it, translates the answer (or the
  stream's events) and stores the new response before answering.
The difference between the last two rows is what the Responses path adds per turn: the
store's read and write, the translation and (streamed) the event rewriting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import httpx
import numpy as np

from proxy import ProxyConfig, create_app
from proxy.config.cluster_file import NodeSpec
from proxy.config.policy_config import Policy, PolicyConfig
from proxy.serving.server import running
from proxy.shared.vocabulary import Role

OPENING = "hello there, how are you? " * 8


async def _post(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                headers: dict[str, str] | None = None) -> httpx.Response:
    if body.get("stream"):
        async with client.stream("POST", url, json=body, headers=headers) as response:
            await response.aread()
    else:
        response = await client.post(url, json=body, headers=headers)
    if response.status_code != 200:
        raise RuntimeError(f"{url} answered {response.status_code}: {response.text}")
    return response


async def _timed(request: Awaitable[httpx.Response]) -> float:
    start = time.perf_counter_ns()
    await request
    return (time.perf_counter_ns() - start) / 1000


async def _chat_turn2(client: httpx.AsyncClient, url: str, extra: dict[str, Any],
                      i: int) -> float:
    """Turn 1 (untimed), then turn 2 with the whole history: its time."""
    session = {"x-session-id": f"chat-{extra}-{i}"}
    first = {"model": "fake-model", "max_tokens": 8,
             "messages": [{"role": "user", "content": OPENING}]}
    reply = (await _post(client, url, first, session)).json()
    second = {**first, **extra, "messages": [
        *first["messages"], reply["choices"][0]["message"],
        {"role": "user", "content": "and then?"}]}
    return await _timed(_post(client, url, second, session))


async def _responses_turn2(client: httpx.AsyncClient, url: str, extra: dict[str, Any],
                           i: int) -> float:
    """Turn 1 (untimed), then turn 2 naming it: its time."""
    first = {"model": "fake-model", "max_output_tokens": 8, "input": OPENING}
    previous = (await _post(client, url, first)).json()["id"]
    second = {**first, **extra, "input": "and then?", "previous_response_id": previous}
    return await _timed(_post(client, url, second))


async def bench(n: int) -> dict[str, np.ndarray]:
    """The rows, in microseconds per request."""
    from tests.fakes.fake_vllm import FakeVLLM  # the benchmark's backend, as bench_decision's

    out: dict[str, np.ndarray] = {}
    async with FakeVLLM("p") as p, FakeVLLM("d") as d:
        config = ProxyConfig(nodes=(NodeSpec(p.url, Role.PREFILL), NodeSpec(d.url, Role.DECODE)),
                             policy=PolicyConfig(kind=Policy.LOCAL), port=0)
        async with running(create_app(config)) as proxy, httpx.AsyncClient(timeout=30) as client:
            chat_url = f"{proxy.url}/v1/chat/completions"
            responses_url = f"{proxy.url}/v1/responses"
            direct_url = f"{d.url}/v1/chat/completions"
            for stream in (False, True):
                how = "streamed" if stream else "whole"
                extra: dict[str, Any] = {"stream": True} if stream else {}
                direct = {"model": "fake-model", "max_tokens": 8, **extra, "messages": [
                    {"role": "user", "content": OPENING},
                    {"role": "assistant", "content": "Hello from d, a fake node."},
                    {"role": "user", "content": "and then?"}]}
                await _post(client, direct_url, direct)
                out[f"direct to the fake D, {how}"] = np.array(
                    [await _timed(_post(client, direct_url, direct)) for _ in range(n)])
                # Interleaved, so both rows see the same moments of the machine.
                chat, responses = [], []
                for i in range(n):
                    chat.append(await _chat_turn2(client, chat_url, extra, i))
                    responses.append(await _responses_turn2(client, responses_url, extra, i))
                out[f"chat completions turn 2 (local), {how}"] = np.array(chat)
                out[f"Responses turn 2 (local), {how}"] = np.array(responses)
    return out


def run(n: int = 200) -> list[tuple[str, np.ndarray]]:
    """All rows, as (label, samples in microseconds)."""
    return list(asyncio.run(bench(n)).items())


def render(rows: list[tuple[str, np.ndarray]]) -> str:
    """The table: p50/p99/mean, and each Responses row's p50 over its chat row's."""
    width = max(len(label) for label, _ in rows)
    lines = [f"{'what':<{width}}  {'n':>5}  {'p50 us':>9}  {'p99 us':>9}  {'mean us':>9}"]
    lines.append("-" * len(lines[0]))
    p50 = {label: float(np.percentile(samples, 50)) for label, samples in rows}
    for label, samples in rows:
        low, high = np.percentile(samples, [50, 99])
        lines.append(f"{label:<{width}}  {len(samples):>5}  {low:>9.0f}  {high:>9.0f}"
                     f"  {samples.mean():>9.0f}")
    for how in ("whole", "streamed"):
        chat = p50[f"chat completions turn 2 (local), {how}"]
        responses = p50[f"Responses turn 2 (local), {how}"]
        floor = p50[f"direct to the fake D, {how}"]
        lines.append(f"{how}: Responses adds {responses - chat:+.0f} us p50 over chat "
                     f"completions; proxy overhead chat {chat - floor:.0f} us, Responses "
                     f"{responses - floor:.0f} us")
    return "\n".join(lines)


def main(n: int) -> int:
    """Run and print."""
    print("Responses API overhead against chat completions (in-process proxy, fake nodes)")
    print(render(run(n)))
    return 0

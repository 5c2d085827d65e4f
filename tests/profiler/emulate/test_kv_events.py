"""An emulated D's KV cache events, read by the proxy's own subscriber and residency index
(in-process, linear preset, D with a 64-block cache): what the index says D holds of a session
is exactly what D's next turn then finds cached, on a local turn and on a P->D one; a session
pushed out of the cache by others reads 0 held while the newest stays resident; the replay
socket re-sends every batch in order; and `CacheEvents` batches a step's stores as vLLM does.

Waits poll the index (events cross a real ZMQ socket) with generous deadlines: the machine
may be loaded, and nothing here depends on how fast."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import zmq
import zmq.asyncio

from profiler.emulate.cache_events import CacheEvents
from profiler.emulate.presets import resolve
from profiler.emulate.serve import HostedNode, hosted
from profiler.emulate.tokenizer import Vocabulary
from profiler.engine.prefix_cache import ROOT_HASH
from proxy.live.kv_events import (
    END_SEQ,
    BlockRemoved,
    BlockStored,
    encode_seq,
    parse_batch,
    parse_seq,
)
from proxy.live.kv_subscriber import KvEventSource, KvEventSubscribers, NodeSubscriber
from proxy.live.residency import NodeResidency
from proxy.shared.vocabulary import Role
from proxy.upstream.pd_protocol import decode_body, prefill_body

MODEL = "llama-3.1-8b"
BLOCKS = 64  # D's KV cache: 64 blocks of 16 tokens
BLOCK = 16
STORY = "Rivers carry silt to the sea and build deltas over many years. "
WAIT_S = 30.0


@pytest.fixture
async def nodes(vocab: Vocabulary) -> AsyncIterator[list[HostedNode]]:
    preset = resolve("linear", MODEL, max_model_len=4096, num_gpu_blocks=BLOCKS)
    async with hosted(preset, [(Role.PREFILL, 0), (Role.DECODE, 0)], vocab=vocab,
                      report_cached_tokens=True, kv_events=True) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=60) as c:
        yield c


@pytest.fixture
async def index(nodes: list[HostedNode], client: httpx.AsyncClient
                ) -> AsyncIterator[NodeResidency]:
    """The proxy's residency index of D, fed by the proxy's subscriber, once it receives."""
    p, d = nodes
    assert p.kv_events is None  # P publishes nothing, as on a vLLM cluster
    assert d.kv_events is not None
    endpoint, replay = d.kv_events
    residency = NodeResidency()
    subscribers = KvEventSubscribers([NodeSubscriber(KvEventSource(d.url, endpoint, replay),
                                                     residency)])
    subscribers.start()
    try:
        # A SUB socket misses what is published before it has joined: store distinct
        # prompts until one batch arrived.
        deadline = time.monotonic() + WAIT_S
        attempt = 0
        while residency.events == 0:
            assert time.monotonic() < deadline, "no KV event reached the subscriber"
            await say(client, d.url, f"warm-up-{attempt}", turn_one(f"warm-up {attempt}", 2), 1)
            attempt += 1
            await asyncio.sleep(0.2)
        yield residency
    finally:
        await subscribers.stop()


def turn_one(session: str, repeats: int = 10) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"[{session}] " + STORY * repeats}]


async def say(client: httpx.AsyncClient, url: str, session: str,
              messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """One local turn on the node, tagged with the session as the proxy tags live legs."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens,
            "session_id": session}
    response = await client.post(f"{url}/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def settled(read: Callable[[], int | None], want: int | None) -> int | None:
    """read() once it equals want, or its last value after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while (value := read()) != want and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return value


def stored_tokens(answer: dict[str, Any]) -> int:
    """Tokens of a finished turn whose KV is in full blocks: prompt and reply, less the last
    sampled token (never computed), in whole blocks."""
    usage = answer["usage"]
    return (usage["prompt_tokens"] + usage["completion_tokens"] - 1) // BLOCK * BLOCK


def next_turn(messages: list[dict[str, str]], answer: dict[str, Any]) -> list[dict[str, str]]:
    reply = answer["choices"][0]["message"]["content"]
    return [*messages, {"role": "assistant", "content": reply},
            {"role": "user", "content": "And lakes?"}]


async def test_what_the_index_says_d_holds_is_what_the_next_turn_finds(
        nodes: list[HostedNode], client: httpx.AsyncClient, index: NodeResidency) -> None:
    d = nodes[1]
    messages = turn_one("s1")
    first = await say(client, d.url, "s1", messages, 40)
    expected = stored_tokens(first)
    assert expected > 100
    held = await settled(lambda: index.held_tokens("s1"), expected)
    assert held == expected
    second = await say(client, d.url, "s1", next_turn(messages, first), 4)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == held
    assert index.held_tokens("other") is None  # never stored: unknown, not "none held"


async def test_a_p_to_d_turn_is_held_under_its_session_with_the_reply(
        nodes: list[HostedNode], client: httpx.AsyncClient, index: NodeResidency) -> None:
    p, d = nodes
    messages = turn_one("pd")
    body = {"model": MODEL, "messages": messages, "max_tokens": 40}
    prefilled = (await client.post(f"{p.url}/v1/chat/completions",
                                   json=prefill_body(body))).json()
    leg = {**decode_body(body, prefilled["kv_transfer_params"]), "session_id": "pd"}
    first = (await client.post(f"{d.url}/v1/chat/completions", json=leg)).json()
    expected = stored_tokens(first)
    assert await settled(lambda: index.held_tokens("pd"), expected) == expected
    second = await say(client, d.url, "pd", next_turn(messages, first), 4)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == expected


async def test_a_session_pushed_out_of_the_cache_reads_none_held(
        nodes: list[HostedNode], client: httpx.AsyncClient, index: NodeResidency) -> None:
    d = nodes[1]
    first = await say(client, d.url, "old", turn_one("old"), 8)
    assert await settled(lambda: index.held_tokens("old"), stored_tokens(first)) > 0
    stored = 0
    for i in range(8):  # ~14 blocks each: twice what D holds
        answer = await say(client, d.url, f"new-{i}", turn_one(f"new-{i}"), 8)
        stored += stored_tokens(answer)
    assert stored > BLOCKS * BLOCK
    assert await settled(lambda: index.held_tokens("old"), 0) == 0
    newest = stored_tokens(answer)
    assert await settled(lambda: index.held_tokens("new-7"), newest) == newest
    assert index.num_blocks <= BLOCKS


async def test_the_replay_socket_resends_every_batch_in_order(
        nodes: list[HostedNode], client: httpx.AsyncClient, index: NodeResidency) -> None:
    d = nodes[1]
    first = await say(client, d.url, "s1", turn_one("s1"), 24)
    assert await settled(lambda: index.held_tokens("s1"), stored_tokens(first)) > 0
    assert d.kv_events is not None and d.kv_events[1] is not None
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    try:
        dealer.connect(d.kv_events[1])
        await dealer.send_multipart([b"", encode_seq(0)])
        rebuilt, seqs = NodeResidency(), []
        while True:
            assert await dealer.poll(WAIT_S * 1000), "the replay socket did not answer"
            frames = await dealer.recv_multipart()
            if frames[2] == END_SEQ:
                break
            assert frames[1] == b"kv"
            batch = parse_batch(parse_seq(frames[2]), frames[3])
            seqs.append(batch.seq)
            for event in batch.events:
                rebuilt.apply(event)
    finally:
        ctx.destroy(linger=0)
    assert seqs == list(range(len(seqs))) and seqs
    assert rebuilt.held_tokens("s1") == index.held_tokens("s1") == stored_tokens(first)


def test_a_steps_stores_become_one_event_per_request_run() -> None:
    events = CacheEvents(block_size=4)
    events.tag("r1", "session-1")
    events.stored(11, ROOT_HASH, [1, 2, 3, 4], "r1")
    events.stored(12, 11, [5, 6, 7, 8], "r1")
    events.stored(21, ROOT_HASH, [9, 9, 9, 9], "r2")  # another request, untagged
    events.removed([99, 98])
    events.stored(13, 12, [1, 1, 1, 1], "r1")  # after the removal: a new event, in order
    assert events.take() == [
        BlockStored((11, 12), None, 8, 4, "session-1", (1, 2, 3, 4, 5, 6, 7, 8)),
        BlockStored((21,), None, 4, 4, None, (9, 9, 9, 9)),
        BlockRemoved((99, 98)),
        BlockStored((13,), 12, 4, 4, "session-1", (1, 1, 1, 1)),
    ]
    assert events.take() == []
    events.untag("r1")
    events.stored(14, 13, [2, 2, 2, 2], "r1")
    assert events.take()[0].session_id is None  # type: ignore[union-attr]

"""Replaying a timed block-hash trace (Mooncake's format): each request at its recorded time.

Unlike a conversation dataset, the trace fixes every turn's arrival: a turn is sent at its
(time-scaled) timestamp whether or not the turn it continues has answered (open loop, as the
traffic was recorded). There is no text: each prompt is token ids made from its block hashes
(`profiler.traces.block_tokens`, shrunk by `--scale-tokens`), sent to `/v1/completions` as a
list of ints, with the conversation's id in `x-session-id` so the proxy files every turn of a
conversation under one session. Its max_tokens is the recorded output length (scaled).

A continuation's prompt is its parent's exact prompt followed by ids of its own later hashes
(`BlockTokens.continuation`), so the proxy, which recognises a continuation by its prompt
strictly extending the ids D holds (`proxy.sessions.session.TokenTranscript`), routes it as
its conversation's next turn once the parent has answered (a turn that arrives before its
parent's reply, open loop, is a first turn of a new branch).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from profiler.replay.client import (
    Clock,
    ReplayConfig,
    ReplayError,
    ReplayResult,
    Sleep,
    _record,
    _Replayer,
    first_model,
)
from profiler.traces.block_tokens import BlockTokens
from profiler.traces.mooncake import TimedRequest


@dataclass(frozen=True, slots=True)
class TimedTurn:
    """One request of the trace as the replay sends it."""

    conversation: str
    turn: int
    arrival_s: float
    prompt: list[int]
    max_tokens: int


def timed_turns(requests: Sequence[TimedRequest], tokens: BlockTokens,
                max_tokens_cap: int | None = None) -> list[TimedTurn]:
    """The window's requests as prompts of token ids, at most max_tokens_cap tokens out; a
    continuation's prompt extends its parent's (requests in arrival order: parents first)."""
    turns = []
    prompts: dict[int, list[int]] = {}  # file index -> prompt, for the turns after it
    for request in requests:
        max_tokens = tokens.scaled(request.record.output_length)
        if max_tokens_cap is not None:
            max_tokens = min(max_tokens, max_tokens_cap)
        parent = prompts.get(request.parent) if request.parent is not None else None
        prompt = (tokens.prompt(request.record) if parent is None
                  else tokens.continuation(request.record, parent))
        prompts[request.record.index] = prompt
        turns.append(TimedTurn(request.conversation, request.turn, request.arrival_s,
                               prompt, max_tokens))
    return turns


def completion_body(model: str, turn: TimedTurn, *, ignore_eos: bool) -> dict[str, Any]:
    """A streaming /v1/completions body whose prompt is the turn's token ids."""
    body: dict[str, Any] = {"model": model, "prompt": turn.prompt, "max_tokens": turn.max_tokens,
                            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM extension: generate exactly max_tokens
    return body


class _TimedReplayer(_Replayer):
    """The replay client's sending and recording, driven by recorded arrival times."""

    async def send_turn(self, turn: TimedTurn) -> None:
        headers = {"x-session-id": turn.conversation} if self.config.session_header else {}
        if self.config.headers_for_turn is not None:
            headers.update(self.config.headers_for_turn(turn.turn))
        body = completion_body(self.model, turn, ignore_eos=self.config.ignore_eos)
        stream = await self._send(body, headers, whole=False)
        record = _record(turn.conversation, turn.turn, self.t0, turn.max_tokens, stream)
        self.records.append(record)
        self.on_record(record)

    async def run_timed(self, turns: Sequence[TimedTurn]) -> None:
        tasks: list[asyncio.Task[None]] = []
        try:
            for turn in sorted(turns, key=lambda t: t.arrival_s):
                delay = self.t0 + turn.arrival_s - self.clock()
                if delay > 0:
                    await self.sleep(delay)
                tasks.append(asyncio.create_task(self.send_turn(turn)))
                self.started += turn.turn == 1
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def replay_timed(
    turns: Sequence[TimedTurn],
    config: ReplayConfig,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Clock = time.perf_counter,
    sleep: Sleep = asyncio.sleep,
    stop: asyncio.Event | None = None,
) -> ReplayResult:
    """Send every turn at its arrival; one record per turn (config's rate and duration only
    label the run). `stop` ends it early with the turns completed so far (`interrupted`)."""
    if not turns:
        raise ReplayError("no requests to replay")
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=config.target, transport=transport, limits=limits,
                                 timeout=httpx.Timeout(config.timeout_s)) as client:
        model = config.model or await first_model(client)
        replayer = _TimedReplayer(config, client, model, clock, sleep)
        main = asyncio.create_task(replayer.run_timed(turns))
        interrupted = False
        if stop is None:
            await main
        else:
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({main, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if main.done():
                main.result()
            else:
                interrupted = True
                main.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await main
        wall = clock() - replayer.t0
    records = sorted(replayer.records, key=lambda record: record.start_s)
    return ReplayResult(records=records, wall_time_s=wall, config=config,
                        n_conversations=replayer.started, interrupted=interrupted)

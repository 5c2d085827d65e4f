"""The open-loop replay client.

New conversations arrive as a Poisson process (gamma inter-arrivals for burstiness != 1, as in
vLLM's serving benchmark); within a conversation the next turn is sent when the previous reply
is complete, plus an optional think time, and carries the actual reply in its history. Every
turn becomes one RequestRecord; timeouts, HTTP errors and connection errors are failed records,
never exceptions. A failed turn ends its conversation (there is no reply to continue from).

Time comes from an injectable clock and sleep so the arrival logic can be tested without
waiting; `arrival_times` (`profiler.traces.arrivals`) is a pure function of a seeded generator.

A `stop` event (set by the CLI on SIGINT/SIGTERM) ends the run early: requests in flight are
abandoned and the result holds the turns completed so far, marked `interrupted`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from profiler.replay.request_bodies import (
    Api,
    History,
    error_message,
    parse_responses_payload,
)
from profiler.traces.arrivals import arrival_times
from profiler.traces.conversation import Conversation
from profiler.traces.request_records import RequestRecord
from proxy.shared.completion import parse_data, parse_payload
from proxy.shared.redact import redacted_url

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class ReplayError(RuntimeError):
    """The replay cannot start (bad target, no model); per-request failures are records."""


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """How to replay: target, load, request shape. Validated once when built."""

    target: str  # proxy base URL, e.g. http://127.0.0.1:8000
    qps: float  # conversation arrival rate
    duration_s: float  # stop starting new conversations after this
    model: str | None = None  # None: the first model of GET /v1/models
    api: Literal["chat", "completions", "responses"] = "chat"
    max_turns: int | None = None
    timeout_s: float = 30.0  # per request, whole stream included
    max_tokens_cap: int = 1024
    ignore_eos: bool = True
    burstiness: float = 1.0  # gamma shape; 1.0 = Poisson
    think_time_s: float = 0.0
    seed: int = 0
    max_conversations: int | None = None
    headers_for_turn: Callable[[int], Mapping[str, str]] | None = None  # e.g. force a route
    progress: bool = False
    session_header: bool = True  # send x-session-id (as vLLM's multi-turn benchmark does)
    # Turns sent without streaming, their answer read whole (its TTFT is its whole time): vLLM
    # returns a D's kv_transfer_params only in a whole answer, so a readback needs the turn
    # before it whole (docs/readback.md; `ppd profile --readback` sends turn 1 so).
    whole_turns: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.target.startswith(("http://", "https://")):
            raise ValueError(f"target must be an http(s) URL, got {self.target!r}")
        if self.qps <= 0 or self.duration_s <= 0:
            raise ValueError("qps and duration_s must be > 0")
        if self.api not in tuple(Api):
            raise ValueError(f"api must be one of {[a.value for a in Api]}, got {self.api!r}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        if self.timeout_s <= 0 or self.max_tokens_cap < 1 or self.burstiness <= 0:
            raise ValueError("timeout_s, max_tokens_cap and burstiness must be positive")
        if self.think_time_s < 0:
            raise ValueError("think_time_s must be >= 0")
        if self.max_conversations is not None and self.max_conversations < 1:
            raise ValueError("max_conversations must be >= 1")


@dataclass(frozen=True, slots=True)
class ReplayResult:
    records: list[RequestRecord]
    wall_time_s: float
    config: ReplayConfig
    n_conversations: int = 0  # conversations started
    interrupted: bool = False  # stopped early: records hold the turns completed until then


@dataclass(slots=True)
class _Stream:
    """Accumulates one streamed answer."""

    start: float
    status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    chunk_times: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    usage: Mapping[str, object] | None = None
    error: str | None = None
    end: float | None = None
    whole: bool = False  # sent without streaming: no per-token times, so no TPOT
    response_id: str | None = None  # the Responses API's id of the answer


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _record(conv_id: str, turn: int, t0: float, max_tokens: int, s: _Stream) -> RequestRecord:
    usage = s.usage or {}
    n_out = _int_or_none(usage.get("completion_tokens"))
    n_out = n_out if n_out is not None else len(s.chunk_times)
    ttft = s.chunk_times[0] - s.start if s.chunk_times else None
    e2e = s.end - s.start if s.end is not None else None
    success = s.status == 200 and s.error is None and n_out >= 1 and ttft is not None
    tpot = None
    if success and n_out > 1 and e2e is not None and ttft is not None and not s.whole:
        tpot = (e2e - ttft) / (n_out - 1)
    turn_header = s.headers.get("x-ppd-turn")
    return RequestRecord(
        conversation_id=conv_id,
        turn=turn,
        route=s.headers.get("x-ppd-route"),
        decode=s.headers.get("x-ppd-decode"),
        prefill=s.headers.get("x-ppd-prefill"),
        start_s=s.start - t0,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        itl_s=tuple(b - a for a, b in zip(s.chunk_times, s.chunk_times[1:], strict=False)),
        n_input_tokens=_int_or_none(usage.get("prompt_tokens")),
        n_output_tokens=n_out,
        success=success,
        error=s.error if s.error or success else "no tokens in the answer",
        status=s.status,
        max_tokens=max_tokens,
        proxy_turn=int(turn_header) if turn_header and turn_header.isdigit() else None,
    )


class _Replayer:
    """One replay run: owns the HTTP client, the clock, and the records."""

    def __init__(self, config: ReplayConfig, client: httpx.AsyncClient, model: str,
                 clock: Clock, sleep: Sleep) -> None:
        self.config = config
        self.api = Api(config.api)
        self.client = client
        self.model = model
        self.clock = clock
        self.sleep = sleep
        self.records: list[RequestRecord] = []
        self.t0 = clock()
        self.on_record: Callable[[RequestRecord], None] = lambda record: None
        # Told how many turns the run will send at most, then (a failed turn ends its
        # conversation) minus the turns that will not be sent after all.
        self.on_total: Callable[[int], None] = lambda total: None
        self.started = 0

    async def _send(self, body: dict, headers: Mapping[str, str], *, whole: bool) -> _Stream:
        """One turn's request and answer, streamed or whole; a timeout or an HTTP error is
        the answer's error, never an exception."""
        s = _Stream(start=self.clock(), whole=whole)
        try:
            async with asyncio.timeout(self.config.timeout_s):
                read = self._read_whole if whole else self._read_stream
                await read(s, body, headers)
        except TimeoutError:
            s.error = f"timeout after {self.config.timeout_s:g} s"
        except httpx.HTTPError as exc:
            s.error = f"{type(exc).__name__}: {exc}"
        finally:
            s.end = self.clock()
        return s

    async def _read_stream(self, s: _Stream, body: dict, headers: Mapping[str, str]) -> None:
        async with self.client.stream(
            "POST", self.api.path, json=body, headers=dict(headers)
        ) as response:
            s.status, s.headers = response.status_code, response.headers
            if response.status_code != 200:
                s.error = error_message(response.status_code, await response.aread())
                return
            if self.api is Api.RESPONSES:
                await self._read_responses_stream(s, response)
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                delta = parse_data(line[5:])
                if delta.done:
                    break
                if delta.error:
                    s.error = delta.error
                    break
                if delta.has_tokens:  # reasoning tokens count for TTFT and ITL too
                    s.chunk_times.append(self.clock())
                    s.text.append(delta.text)
                if delta.usage:
                    s.usage = delta.usage

    async def _read_responses_stream(self, s: _Stream, response: httpx.Response) -> None:
        """The Responses API's events: text deltas, then the final response's usage and id."""
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            try:
                event = parse_responses_payload(json.loads(line[5:]))
            except ValueError:
                event = parse_responses_payload(None)
            if event.error:
                s.error = event.error
                return
            if event.text:
                s.chunk_times.append(self.clock())
                s.text.append(event.text)
            if event.done:
                s.usage, s.response_id = event.usage, event.response_id
                return

    async def _read_whole(self, s: _Stream, body: dict, headers: Mapping[str, str]) -> None:
        """A turn sent without streaming: one 'chunk' when the whole answer has arrived."""
        body = {**body, "stream": False}
        body.pop("stream_options", None)
        response = await self.client.post(self.api.path, json=body, headers=dict(headers))
        s.status, s.headers = response.status_code, response.headers
        if response.status_code != 200:
            s.error = error_message(response.status_code, response.content)
            return
        if self.api is Api.RESPONSES:
            whole = parse_responses_payload(response.json())
            s.usage, s.response_id, s.error = whole.usage, whole.response_id, whole.error
            if whole.text:
                s.chunk_times.append(self.clock())
                s.text.append(whole.text)
            return
        try:
            answer = parse_payload(response.json())
        except ValueError:
            answer = parse_payload(None)
        if answer.error:
            s.error = answer.error
        elif answer.has_tokens:
            s.chunk_times.append(self.clock())
            s.text.append(answer.text)
        s.usage = answer.usage

    async def conversation(self, conversation: Conversation, conv_id: str) -> None:
        """Send the conversation's turns one after another; stop at the first failure."""
        config = self.config
        history = History(self.api, conversation.system)
        turns = conversation.turns[: config.max_turns] if config.max_turns else conversation.turns
        for turn_index, turn in enumerate(turns, start=1):
            history.add_user(turn.user)
            max_tokens = min(turn.n_out_tokens or config.max_tokens_cap, config.max_tokens_cap)
            headers: dict[str, str] = {}
            if config.session_header:
                headers["x-session-id"] = conv_id
            if config.headers_for_turn is not None:
                headers.update(config.headers_for_turn(turn_index))
            body = history.body(self.model, max_tokens, ignore_eos=config.ignore_eos)
            stream = await self._send(body, headers, whole=turn_index in config.whole_turns)
            record = _record(conv_id, turn_index, self.t0, max_tokens, stream)
            self.records.append(record)
            self.on_record(record)
            if not record.success:
                self.on_total(-(len(turns) - turn_index))
                return
            history.add_reply("".join(stream.text), stream.response_id)
            if config.think_time_s and turn_index < len(turns):
                await self.sleep(config.think_time_s)

    async def run(self, conversations: Sequence[Conversation],
                  stop: asyncio.Event | None = None) -> bool:
        """Start conversations at their arrival times and wait for all of them, or until
        `stop` is set (then in-flight turns are abandoned); True iff stopped early."""
        main = asyncio.create_task(self._run(conversations))
        if stop is None:
            await main
            return False
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({main, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if main.done():
            stopped.cancel()
            main.result()
            return False
        main.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await main
        return True

    async def _run(self, conversations: Sequence[Conversation]) -> None:
        config = self.config
        rng = random.Random(config.seed)
        arrivals = arrival_times(config.qps, config.duration_s, rng,
                                 burstiness=config.burstiness,
                                 max_count=config.max_conversations)
        if len(arrivals) > len(conversations):
            log.warning("%d arrivals but %d conversations: conversations repeat",
                        len(arrivals), len(conversations))
        per_conversation = [len(c.turns[: config.max_turns] if config.max_turns else c.turns)
                            for c in conversations]
        self.on_total(sum(per_conversation[i % len(conversations)]
                          for i in range(len(arrivals))))
        tasks: list[asyncio.Task[None]] = []
        try:
            for index, at in enumerate(arrivals):
                delay = self.t0 + at - self.clock()
                if delay > 0:
                    await self.sleep(delay)
                conversation = conversations[index % len(conversations)]
                cycle = index // len(conversations)
                # A repeated conversation gets its own id, so the proxy sees a new session.
                conv_id = conversation.id if cycle == 0 else f"{conversation.id}#{cycle}"
                tasks.append(asyncio.create_task(self.conversation(conversation, conv_id)))
                self.started += 1
            await asyncio.gather(*tasks)
        finally:
            # A stop cancels this task: the conversations still running end with it.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def first_model(client: httpx.AsyncClient) -> str:
    """The id of the first model the target lists at GET /v1/models."""
    try:
        response = await client.get("/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        base = redacted_url(str(client.base_url).rstrip("/"))
        hint = f": is the proxy running at {base}?" if isinstance(exc, httpx.TransportError) else ""
        raise ReplayError(f"cannot get a model from {base}/v1/models: {type(exc).__name__}: "
                          f"{exc}{hint}") from None


async def replay(
    conversations: Sequence[Conversation],
    config: ReplayConfig,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Clock = time.perf_counter,
    sleep: Sleep = asyncio.sleep,
    stop: asyncio.Event | None = None,
) -> ReplayResult:
    """Replay conversations against config.target; one record per turn completed.

    Setting `stop` ends the run early with the turns completed so far (`interrupted`)."""
    if not conversations:
        raise ReplayError("no conversations to replay")
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(config.timeout_s)
    async with httpx.AsyncClient(base_url=config.target, transport=transport, limits=limits,
                                 timeout=timeout) as client:
        model = config.model or await first_model(client)
        replayer = _Replayer(config, client, model, clock, sleep)
        progress = None
        if config.progress:
            from tqdm import tqdm

            # A total (turns planned, less those a failure cancels) gives tqdm its ETA.
            progress = tqdm(desc="replay", unit="turn", dynamic_ncols=True, total=0)
            replayer.on_record = lambda record: progress.update(1)
            replayer.on_total = lambda change: _grow_total(progress, change)
        try:
            interrupted = await replayer.run(conversations, stop)
        finally:
            if progress is not None:
                progress.close()
        wall = clock() - replayer.t0
    records = sorted(replayer.records, key=lambda record: record.start_s)
    return ReplayResult(records=records, wall_time_s=wall, config=config,
                        n_conversations=replayer.started, interrupted=interrupted)


def _grow_total(progress: Any, change: int) -> None:
    progress.total = max(progress.n, (progress.total or 0) + change)
    progress.refresh()

"""One emulated node in real time: steps its engine on the wall clock and streams the tokens.

The step loop runs a step, sleeps until the step's modelled end and then delivers what it
produced, so a token reaches its client when the modelled GPU would have produced it. While
the engine stays busy, the next step starts at the previous step's modelled end, not at the
moment the loop woke up: lateness (a busy CPU, timer slack) delays delivery but does not
accumulate into the model's timeline. `Pacing` records how late steps were delivered, which is
how far one process keeps up with real time.

KV pulls the engine asks for (a D job got its blocks) go to `on_pull`; the node's owner models
the transfer and calls `kv_arrived`. A P job's held KV is freed by `hold_released` (its D has
the KV) or after HOLD_TIMEOUT_S. A step's KV cache events go to `on_kv_events` when its
tokens do (at the step's modelled end, as vLLM publishes after a step), before them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from profiler.emulate.engine_interface import Job, NodeEngine, Tick
from proxy.live.kv_events import KvEvent

# How long P keeps a prompt's KV for a D that never pulls it (vLLM's
# VLLM_NIXL_ABORT_REQUEST_TIMEOUT is 480 s; shorter here, as nothing real is held).
HOLD_TIMEOUT_S = 120.0
# A step delivered later than this after its modelled end counts as late.
LATE_S = 0.005

log = logging.getLogger("ppd.emulate")


class EngineFailed(RuntimeError):
    """The engine raised inside the step loop: the node cannot serve anymore."""


@dataclass(slots=True)
class Pacing:
    """How late step results reached clients compared with their modelled end."""

    steps: int = 0
    late_steps: int = 0
    total_lag_s: float = 0.0
    max_lag_s: float = 0.0
    tokens: int = 0
    busy_s: float = 0.0  # modelled time spent in steps

    def record(self, lag_s: float, tokens: int, duration_s: float) -> None:
        self.steps += 1
        self.tokens += tokens
        self.busy_s += duration_s
        self.total_lag_s += lag_s
        self.max_lag_s = max(self.max_lag_s, lag_s)
        if lag_s > LATE_S:
            self.late_steps += 1


@dataclass(slots=True)
class Stream:
    """A submitted job: token counts as the steps that make them end, then its cache hit."""

    job: Job
    arrival: float
    cached_tokens: int = 0  # prompt tokens it found cached or received (known at the end)
    finished: bool = False
    _queue: asyncio.Queue[int | BaseException | None] = field(default_factory=asyncio.Queue)

    async def tokens(self) -> AsyncIterator[int]:
        """Numbers of tokens produced, step by step, until the job ends (EngineFailed if the
        engine broke: a client never waits forever)."""
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class EmulatedNode:
    """An engine driven on the wall clock; `submit` returns a Stream of its tokens."""

    def __init__(self, engine: NodeEngine, *,
                 on_token: Callable[[Stream, float, int], None] | None = None,
                 on_pull: Callable[[str, int], None] | None = None,
                 on_kv_events: Callable[[list[KvEvent]], None] | None = None) -> None:
        self.engine = engine
        self.pacing = Pacing()
        self._streams: dict[str, Stream] = {}
        self._held: dict[str, asyncio.TimerHandle] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._on_token = on_token
        self._on_pull = on_pull
        self._on_kv_events = on_kv_events
        self.failure: EngineFailed | None = None

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def start(self) -> None:
        if self._task is None:
            self._wake = asyncio.Event()  # bound to the serving loop
            self._task = asyncio.create_task(self._run(), name="emulated-node")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, job: Job) -> Stream:
        """Queue a job (JobRejected if it can never run here, EngineFailed if it broke)."""
        if self.failure is not None:
            raise self.failure
        stream = Stream(job, self.now())
        self.engine.submit(job, stream.arrival)
        self._streams[job.id] = stream
        self._wake.set()
        return stream

    def kv_arrived(self, job_id: str) -> None:
        self.engine.kv_arrived(job_id)
        self._wake.set()

    def hold_released(self, job_id: str) -> None:
        """D has the KV of P's job `job_id` (or gave up on it), or a P has read back the KV
        this D kept for job `job_id` (or its TTL passed): free it."""
        timer = self._held.pop(job_id, None)
        if timer is not None:
            timer.cancel()
            self.engine.release_kv(job_id)
            self._wake.set()

    def abort(self, job_id: str) -> None:
        """The client went away: drop the job (a no-op once it finished)."""
        if self._streams.pop(job_id, None) is not None:
            self.engine.abort(job_id, self.now())
            self._wake.set()

    async def _run(self) -> None:
        try:
            await self._steps()
        except Exception as exc:  # an engine bug must not leave clients waiting forever
            log.exception("emulated node: the engine failed; failing its requests")
            self.failure = EngineFailed(f"the emulated engine failed: {exc!r}")
            for stream in self._streams.values():
                stream._queue.put_nowait(self.failure)
            self._streams.clear()

    async def _steps(self) -> None:
        previous_end: float | None = None  # set while the engine stays busy step after step
        while True:
            if self.engine.next_step_time() is None:
                previous_end = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self.now()
            tick = self.engine.step(now if previous_end is None else min(previous_end, now))
            for job_id, tokens in tick.kv_pulls:
                if self._on_pull is not None:
                    self._on_pull(job_id, tokens)
            delay = tick.end - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let arrivals and transfers in between late steps
            self.pacing.record(max(0.0, self.now() - tick.end), sum(tick.emitted.values()),
                               tick.duration_s)
            self._deliver(tick)
            previous_end = tick.end

    def _deliver(self, tick: Tick) -> None:
        if tick.kv_events and self._on_kv_events is not None:
            self._on_kv_events(tick.kv_events)
        now = self.now()
        for job_id, n in tick.emitted.items():
            stream = self._streams.get(job_id)
            if stream is not None:
                if self._on_token is not None:
                    self._on_token(stream, now, n)
                stream._queue.put_nowait(n)
        for job_id in tick.finished:
            stream = self._streams.pop(job_id, None)
            if stream is None:
                continue
            stream.cached_tokens = tick.cached.get(job_id, 0)
            stream.finished = True
            stream._queue.put_nowait(None)
            # A P job's KV waits for its D; a kept D job's for a readback, until its TTL.
            hold_s = HOLD_TIMEOUT_S if stream.job.hold_kv else stream.job.keep_kv_s
            if hold_s is not None:
                loop = asyncio.get_running_loop()
                self._held[job_id] = loop.call_later(hold_s, self.hold_released, job_id)

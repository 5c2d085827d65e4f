"""One emulated node in real time: steps its engine on the wall clock and streams the tokens.

The step loop runs a step, sleeps until the step's modelled end and then delivers what it
produced, so a token reaches its client when the modelled GPU would have produced it. While
the engine stays busy, the next step starts at the previous step's modelled end, not at the
moment the loop woke up: lateness (a busy CPU, timer slack) delays delivery but does not
accumulate into the model's timeline. `Pacing` records how late steps were delivered, which is
how far one process keeps up with real time.

D's KV transfer from a P hosted in the same process runs on P's shared link (link.py); the P
is told to free the KV when it has arrived, as NixlConnector's notification does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from profiler.emulate.link import SharedLink
from profiler.emulate.port import Admission, Job, NodeEngine

# How long P keeps a prompt's KV for a D that never pulls it (vLLM's
# VLLM_NIXL_ABORT_REQUEST_TIMEOUT is 480 s; shorter here, as nothing real is held).
HOLD_TIMEOUT_S = 120.0


class JobFailed(Exception):
    """The engine dropped the job (e.g. it can never fit in the KV cache)."""


@dataclass(slots=True)
class Pacing:
    """How late step results reached clients compared with their modelled end."""

    steps: int = 0
    late_steps: int = 0  # delivered more than LATE_S after the modelled end
    total_lag_s: float = 0.0
    max_lag_s: float = 0.0
    tokens: int = 0
    busy_s: float = 0.0  # modelled time spent in steps
    LATE_S: float = field(default=0.005, repr=False)

    def record(self, lag_s: float, tokens: int, duration_s: float) -> None:
        self.steps += 1
        self.tokens += tokens
        self.busy_s += duration_s
        self.total_lag_s += lag_s
        self.max_lag_s = max(self.max_lag_s, lag_s)
        if lag_s > self.LATE_S:
            self.late_steps += 1


@dataclass(slots=True)
class _Ticket:
    job: Job
    arrival: float
    tokens: asyncio.Queue[int | BaseException | None] = field(default_factory=asyncio.Queue)
    admission: Admission | None = None


@dataclass(slots=True)
class Stream:
    """A submitted job: its admission, then token counts as steps deliver them."""

    admission: Admission
    _ticket: _Ticket

    async def tokens(self) -> AsyncIterator[int]:
        """Numbers of tokens produced, step by step, until the job ends (JobFailed on failure)."""
        while True:
            item = await self._ticket.tokens.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class EmulatedNode:
    """An engine driven on the wall clock; `submit` returns a Stream of its tokens."""

    def __init__(self, engine: NodeEngine, *, clock: Callable[[], float] = time.monotonic,
                 on_token: Callable[[_Ticket, float, int], None] | None = None) -> None:
        self.engine = engine
        self.pacing = Pacing()
        self.link: SharedLink | None = None  # this node's egress, when it serves as a P
        self._clock = clock
        self._tickets: dict[str, _Ticket] = {}
        self._held: dict[str, asyncio.TimerHandle] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._on_token = on_token

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="emulated-node")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, job: Job) -> Stream:
        """Queue a job; its tokens arrive on the Stream as the steps that make them end."""
        ticket = _Ticket(job, self._clock())
        ticket.admission = self.engine.submit(job)
        self._tickets[job.id] = ticket
        self._wake.set()
        return Stream(ticket.admission, ticket)

    def kv_arrived(self, job_id: str) -> None:
        self.engine.kv_arrived(job_id)
        self._wake.set()

    def hold_released(self, job_id: str) -> None:
        """D has the KV of P's job `job_id` (or gave up on it): free it."""
        timer = self._held.pop(job_id, None)
        if timer is not None:
            timer.cancel()
            self.engine.release_kv(job_id)
            self._wake.set()

    def abort(self, job_id: str) -> None:
        """The client went away: drop the job (a no-op once it finished)."""
        if self._tickets.pop(job_id, None) is not None:
            self.engine.abort(job_id)
            self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        modelled_end: float | None = None  # the previous step's end while the engine is busy
        while True:
            if not self.engine.has_work():
                modelled_end = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = loop.time()
            start = now if modelled_end is None else min(modelled_end, now)
            tick = self.engine.step()
            modelled_end = start + tick.duration_s
            delay = modelled_end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = max(0.0, loop.time() - modelled_end)
            self.pacing.record(lag, sum(tick.emitted.values()), tick.duration_s)
            self._deliver(tick.emitted, tick.finished, tick.failed)
            if tick.duration_s <= 0:
                await asyncio.sleep(0)  # an empty step (nothing fit): let arrivals in

    def _deliver(self, emitted: dict[str, int], finished: list[str],
                 failed: dict[str, str]) -> None:
        now = self._clock()
        for job_id, n in emitted.items():
            ticket = self._tickets.get(job_id)
            if ticket is not None:
                if self._on_token is not None:
                    self._on_token(ticket, now, n)
                ticket.tokens.put_nowait(n)
        for job_id in finished:
            ticket = self._tickets.pop(job_id, None)
            if ticket is None:
                continue
            ticket.tokens.put_nowait(None)
            if ticket.job.hold_kv:
                loop = asyncio.get_running_loop()
                self._held[job_id] = loop.call_later(HOLD_TIMEOUT_S, self.hold_released, job_id)
        for job_id, reason in failed.items():
            ticket = self._tickets.pop(job_id, None)
            if ticket is not None:
                ticket.tokens.put_nowait(JobFailed(reason))

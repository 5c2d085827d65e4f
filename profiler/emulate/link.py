"""KV transfers in real time: the P->D transfers from one P share its link fairly.

A transfer takes latency + bytes / (bandwidth / n), where n is the number of transfers in
flight on the link at each moment (processor sharing), recomputed whenever one starts or ends.
The runtime awaits `transfer(nbytes)`; nothing here knows about engines or HTTP.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Flow:
    remaining: float  # bytes
    done: asyncio.Future[None]


@dataclass(slots=True)
class SharedLink:
    """One link (P's egress) with its bandwidth shared by the transfers in flight."""

    bandwidth_bytes_s: float
    latency_s: float = 0.0
    _flows: list[_Flow] = field(default_factory=list)
    _last: float = 0.0
    _timer: asyncio.TimerHandle | None = None
    bytes_sent: float = 0.0
    transfers: int = 0

    async def transfer(self, nbytes: float) -> None:
        """Return once nbytes have crossed the link (after its latency)."""
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        if nbytes <= 0:
            return
        loop = asyncio.get_running_loop()
        self._advance(loop.time())
        flow = _Flow(float(nbytes), loop.create_future())
        self._flows.append(flow)
        self.transfers += 1
        self._reschedule(loop)
        try:
            await asyncio.shield(flow.done)
        except asyncio.CancelledError:
            if flow in self._flows:  # the request went away: its bytes stop competing
                self._advance(loop.time())
                self._flows.remove(flow)
                self._reschedule(loop)
            raise

    def _advance(self, now: float) -> None:
        if self._flows:
            share = self.bandwidth_bytes_s * (now - self._last) / len(self._flows)
            for flow in self._flows:
                sent = min(share, flow.remaining)
                flow.remaining -= sent
                self.bytes_sent += sent
        self._last = now

    def _reschedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for flow in [f for f in self._flows if f.remaining <= 1e-6]:
            self._flows.remove(flow)
            if not flow.done.done():
                flow.done.set_result(None)
        if self._flows:
            first = min(f.remaining for f in self._flows)
            delay = first * len(self._flows) / self.bandwidth_bytes_s
            self._timer = loop.call_later(delay, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._advance(loop.time())
        for flow in self._flows:  # float residue: the flow the timer was set for is done
            if flow.remaining * len(self._flows) / self.bandwidth_bytes_s < 1e-6:
                flow.remaining = 0.0
        self._reschedule(loop)

    @property
    def in_flight(self) -> int:
        return len(self._flows)

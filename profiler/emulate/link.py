"""KV transfers in real time: `profiler.engine.transfer.SharedLink` on the event loop's clock.

The link model is the simulator's (processor sharing after a per-transfer latency, the
simulator's maths); this wrapper only drives it with `loop.time()` and wakes each waiting
transfer when the model says it is done. The runtime awaits `transfer(nbytes)`; nothing here
knows about engines or HTTP.
"""

from __future__ import annotations

import asyncio
import itertools

from profiler.engine.transfer import Link, SharedLink


class WallClockLink:
    """One link (a P's egress) whose transfers are awaited in real time."""

    def __init__(self, link: Link) -> None:
        self._shared = SharedLink(link)
        self._waiting: dict[str, asyncio.Future[None]] = {}
        self._ids = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self.transfers = 0

    @property
    def in_flight(self) -> int:
        """Transfers started and not yet done (in their latency or moving bytes)."""
        return len(self._waiting)

    @property
    def bytes_moved(self) -> float:
        """Bytes of the transfers done or in flight (a cancelled one's unsent bytes aside)."""
        return self._shared.bytes_moved

    async def transfer(self, nbytes: float) -> None:
        """Return once nbytes have crossed the link (after its latency)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._settle(loop, now)  # transfers due by now finish before this one takes a share
        transfer_id = str(next(self._ids))
        done = self._waiting[transfer_id] = loop.create_future()
        self._shared.start(transfer_id, max(0.0, float(nbytes)), now)
        self.transfers += 1
        self._settle(loop, now)
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            if self._waiting.pop(transfer_id, None) is not None:  # its bytes stop competing
                now = loop.time()
                self._settle(loop, now)
                self._shared.cancel(transfer_id, now)
                self._settle(loop, now)
            raise

    def _settle(self, loop: asyncio.AbstractEventLoop, now: float | None = None) -> None:
        """Wake the transfers done by `now` (the loop's time when None); set the timer for
        the next one to finish."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for transfer_id in self._shared.advance(loop.time() if now is None else now):
            done = self._waiting.pop(transfer_id, None)
            if done is not None and not done.done():
                done.set_result(None)
        due = self._shared.next_completion()
        if due is not None:
            self._timer = loop.call_at(due, self._settle, loop)

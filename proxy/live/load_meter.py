"""Load meter: conversation turns per second over a sliding window, on an injected clock.

"Load" in ppd is this offered rate (a table's qps points, `ppd sim --qps`); how busy a node is
(requests running and waiting) is `proxy.observability.node_gauges`."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

# The proxy's --load-window default: long enough to smooth a bursty replay's arrivals.
DEFAULT_LOAD_WINDOW_S = 30.0


class RateMeter:
    """Events per second over the last `window` seconds."""

    def __init__(self, window: float, clock: Callable[[], float]) -> None:
        if window <= 0:
            raise ValueError("window must be > 0")
        self._window = window
        self._clock = clock
        self._events: deque[float] = deque()

    def record(self) -> None:
        """Count one event now."""
        now = self._clock()
        self._events.append(now)
        self._trim(now)

    def rate(self) -> float:
        """Events per second over the window ending now."""
        now = self._clock()
        self._trim(now)
        return len(self._events) / self._window

    def _trim(self, now: float) -> None:
        while self._events and self._events[0] <= now - self._window:
            self._events.popleft()


class RunningMean:
    """Mean of observed values, with a prior used until the first observation."""

    def __init__(self, prior: float) -> None:
        self._prior = prior
        self._total = 0.0
        self._count = 0

    def add(self, value: float) -> None:
        """Observe one value (one that is not finite is not an observation: it would make
        the mean inf or NaN for good)."""
        if not math.isfinite(value):
            return
        self._total += value
        self._count += 1

    @property
    def value(self) -> float:
        """The mean so far (the prior before any observation)."""
        return self._total / self._count if self._count else self._prior

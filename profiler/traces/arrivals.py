"""When conversations arrive: the open-loop arrival process the replay client and the
simulator share (a pure function of a seeded generator)."""

from __future__ import annotations

import random


def arrival_times(
    qps: float,
    duration_s: float,
    rng: random.Random,
    *,
    burstiness: float = 1.0,
    max_count: int | None = None,
) -> list[float]:
    """Start times (s) of conversations arriving at rate qps until duration_s.

    Inter-arrival gaps are gamma(shape=burstiness, scale=1/(qps*burstiness)): mean 1/qps
    for every shape; shape 1 is exponential (Poisson arrivals), below 1 burstier.
    """
    times: list[float] = []
    now = 0.0
    while max_count is None or len(times) < max_count:
        now += rng.gammavariate(burstiness, 1.0 / (qps * burstiness))
        if now >= duration_s:
            break
        times.append(now)
    return times

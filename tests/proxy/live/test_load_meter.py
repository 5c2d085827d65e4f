"""proxy.live.load_meter: the turns-per-second meter and the running mean of output lengths."""

from __future__ import annotations

from proxy.live.load_meter import RateMeter, RunningMean
from tests.proxy.helpers import FakeClock


def test_rate_meter_counts_over_a_sliding_window() -> None:
    clock = FakeClock()
    meter = RateMeter(10.0, clock)
    for _ in range(5):
        meter.record()
        clock.now += 1.0
    assert meter.rate() == 0.5  # 5 turns in the last 10 s
    clock.now = 10.5  # the turns at 0.0 s falls out of (0.5, 10.5]
    assert meter.rate() == 0.4
    clock.now = 100.0
    assert meter.rate() == 0.0


def test_running_mean_uses_its_prior_until_it_has_data() -> None:
    mean = RunningMean(128)
    assert mean.value == 128
    mean.add(10)
    mean.add(30)
    assert mean.value == 20

"""The load meter, the running mean and the metrics' JSON counters."""

from __future__ import annotations

from proxy.load_meter import RateMeter, RunningMean
from proxy.metrics import ProxyMetrics
from proxy.vocabulary import Decision, Reason, RouteKind
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


def test_stats_local_share_and_errors() -> None:
    metrics = ProxyMetrics("ppd", lambda: 3)
    metrics.routed("/v1/chat/completions", RouteKind.PD, Decision(RouteKind.PD, Reason.TURN1), 1)
    for _ in range(3):
        metrics.routed("/v1/chat/completions", RouteKind.LOCAL,
                       Decision(RouteKind.LOCAL, Reason.POLICY), 2)
    metrics.upstream_error("decode", "status")
    stats = metrics.stats()
    assert stats["local_share"] == 0.75
    assert stats["upstream_errors"] == {"decode:status": 1}
    assert b"ppd_sessions_live 3.0" in metrics.exposition()
    # Each app owns its registry: a second instance does not clash with the first.
    assert ProxyMetrics("pd", lambda: 0).stats()["requests"] == 0

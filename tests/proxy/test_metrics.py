"""proxy.metrics: the /stats counters beside the Prometheus registry."""

from __future__ import annotations

from proxy.metrics import ProxyMetrics
from proxy.vocabulary import Decision, Reason, RouteKind


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

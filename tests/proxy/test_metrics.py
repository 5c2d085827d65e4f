"""proxy.metrics: the /stats counters beside the Prometheus registry."""

from __future__ import annotations

import enum

import pytest

from proxy import routes
from proxy.metrics import ProxyMetrics
from proxy.routes import ROUTES, RouteSpec
from proxy.vocabulary import Decision, Reason, Role, RouteKind


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


def test_every_declared_route_has_latency_series_before_its_first_request() -> None:
    exposition = ProxyMetrics("pd", lambda: 0).exposition().decode()
    for kind in ROUTES:
        assert f'ppd_time_to_first_token_seconds_count{{route="{kind.value}"}} 0.0' \
            in exposition
        assert f'ppd_e2e_request_latency_seconds_count{{route="{kind.value}"}} 0.0' \
            in exposition


def test_a_new_route_and_its_fallback_reason_show_up_without_editing_metrics(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A route and a reason that proxy.vocabulary does not have: metrics must take both from
    # the declaration, not from a list of its own.
    echo = enum.StrEnum("TestRoute", {"ECHO": "echo"}).ECHO  # type: ignore[attr-defined]
    gone = enum.StrEnum("TestReason", {"ECHO_GONE": "echo_gone"}).ECHO_GONE  # type: ignore[attr-defined]
    spec = RouteSpec(echo, (Role.DECODE,), fallback=RouteKind.PD,  # type: ignore[arg-type]
                     fallback_reasons=(gone,))  # type: ignore[arg-type]
    monkeypatch.setattr(routes, "ROUTES", {**routes.ROUTES, echo: spec})
    metrics = ProxyMetrics("pd", lambda: 0)
    assert 'ppd_time_to_first_token_seconds_count{route="echo"} 0.0' \
        in metrics.exposition().decode()
    assert metrics.stats()["echo"] == {"served": 0, "fallbacks": {}}
    metrics.routed("/v1/completions", echo, Decision(echo, Reason.POLICY), 2)  # type: ignore[arg-type]
    metrics.routed("/v1/completions", RouteKind.PD, Decision(RouteKind.PD, gone), 2)  # type: ignore[arg-type]
    stats = metrics.stats()
    assert stats["echo"] == {"served": 1, "fallbacks": {"echo_gone": 1}}
    assert stats["reasons"] == {"policy": 1, "echo_gone": 1}
    assert 'reason="echo_gone"' in metrics.exposition().decode()


def test_readback_fallbacks_are_the_declared_ones() -> None:
    metrics = ProxyMetrics("readback", lambda: 0)
    for reason in ROUTES[RouteKind.READBACK].fallback_reasons:
        metrics.routed("/v1/completions", RouteKind.PD, Decision(RouteKind.PD, reason), 2)
    metrics.routed("/v1/completions", RouteKind.PD, Decision(RouteKind.PD, Reason.NO_HOME), 2)
    metrics.read_back(12)
    readback = metrics.stats()["readback"]
    assert readback == {"served": 0, "tokens": 12, "fallbacks": {
        "readback_missing": 1, "readback_expired": 1, "readback_mismatch": 1}}

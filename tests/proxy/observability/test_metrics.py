"""proxy.observability.metrics: the /stats counters beside the Prometheus registry."""

from __future__ import annotations

import enum

import pytest

from proxy.observability.metrics import ProxyMetrics
from proxy.shared import routes
from proxy.shared.routes import ROUTES, RouteSpec
from proxy.shared.vocabulary import Decision, Reason, Role, RouteKind


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
    # A route and a reason that proxy.shared.vocabulary does not have: metrics must take both from
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
    declared = ROUTES[RouteKind.READBACK].fallback_reasons
    assert {"readback_missing", "readback_expired", "readback_mismatch"} <= set(declared)
    assert readback == {"served": 0, "tokens": 12, "fallbacks": {
        reason.value: 1 for reason in declared}}  # no_home is not one of them


def _sample(metrics: ProxyMetrics, name: str, **labels: str) -> float | None:
    """One sample's value from the exposition (None: no such sample)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def test_fallbacks_are_counted_by_the_route_wanted_and_why() -> None:
    metrics = ProxyMetrics("pd", lambda: 0)
    missing = Decision(RouteKind.PD, Reason.READBACK_MISSING)
    metrics.routed("/v1/completions", RouteKind.PD, missing, 2,
                   (RouteKind.READBACK, Reason.READBACK_MISSING))
    metrics.routed("/v1/completions", RouteKind.PD, missing, 2,
                   (RouteKind.READBACK, Reason.READBACK_MISSING))
    metrics.routed("/v1/completions", RouteKind.PD, Decision(RouteKind.LOCAL, Reason.LIVE), 2,
                   (RouteKind.LOCAL, Reason.NO_HOME))
    metrics.routed("/v1/completions", RouteKind.PD, Decision(RouteKind.PD, Reason.TURN1), 1)
    assert _sample(metrics, "ppd_fallbacks_total", route="readback",
                   reason="readback_missing") == 2.0
    assert _sample(metrics, "ppd_fallbacks_total", route="local", reason="no_home") == 1.0
    assert _sample(metrics, "ppd_requests_total", endpoint="/v1/completions", route="pd",
                   reason="turn1", context_class="", workload="", qps="") == 1.0


def test_turn_2_plus_ttft_is_kept_apart_by_route() -> None:
    metrics = ProxyMetrics("pd", lambda: 0)
    metrics.first_byte(RouteKind.PD, 0.9, turn=1)
    metrics.first_byte(RouteKind.LOCAL, 0.04, turn=2)
    metrics.first_byte(RouteKind.PD, 0.2, turn=3)
    name = "ppd_followup_time_to_first_token_seconds"
    assert _sample(metrics, f"{name}_count", route="local") == 1.0
    assert _sample(metrics, f"{name}_count", route="pd") == 1.0  # turn 1's 0.9 s is not in it
    assert _sample(metrics, f"{name}_sum", route="pd") == pytest.approx(0.2)
    assert _sample(metrics, "ppd_time_to_first_token_seconds_count", route="pd") == 2.0


def test_usable_nodes_by_role_read_zero_for_a_role_with_none() -> None:
    metrics = ProxyMetrics("pd", lambda: 0)
    nodes = [
        {"url": "http://p1", "role": "prefill", "in_flight": 1, "healthy": True,
         "circuit": "closed"},
        {"url": "http://d1", "role": "decode", "in_flight": 0, "healthy": True,
         "circuit": "open"},
        {"url": "http://d2", "role": "decode", "in_flight": 0, "healthy": False,
         "circuit": "closed"},
        {"url": "http://d3", "role": "decode", "in_flight": 2, "healthy": True,
         "circuit": "half_open"},  # its probe is waiting for a request: usable
    ]
    metrics.watch(lambda: nodes, lambda: 1)
    assert _sample(metrics, "ppd_nodes", role="decode") == 3.0
    assert _sample(metrics, "ppd_nodes_usable", role="decode") == 1.0
    assert _sample(metrics, "ppd_nodes_usable", role="prefill") == 1.0
    assert _sample(metrics, "ppd_nodes_usable", role="replica") == 0.0
    nodes[3]["healthy"] = False
    assert _sample(metrics, "ppd_nodes_usable", role="decode") == 0.0


def test_node_load_is_what_each_nodes_metrics_said_and_how_old_that_is() -> None:
    from proxy.observability.node_gauges import NodeMetrics

    now = [100.0]
    latest = {"http://d1": NodeMetrics(running=7, waiting=2, kv_usage=0.25, at=97.5),
              "http://p1": NodeMetrics(running=1, waiting=0, kv_usage=None, at=99.0)}
    metrics = ProxyMetrics("live", lambda: 0)
    metrics.watch_node_load(lambda: latest, lambda: now[0])
    assert _sample(metrics, "ppd_node_requests_running", node="http://d1") == 7.0
    assert _sample(metrics, "ppd_node_requests_waiting", node="http://d1") == 2.0
    assert _sample(metrics, "ppd_node_kv_cache_usage", node="http://d1") == 0.25
    assert _sample(metrics, "ppd_node_kv_cache_usage", node="http://p1") is None  # unknown
    assert _sample(metrics, "ppd_node_metrics_age_seconds", node="http://d1") == 2.5

"""proxy.observability.metric_series: the same /metrics text as prometheus_client's own Counter and
Histogram."""

from __future__ import annotations

import math

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest

from proxy.observability import metric_series

BUCKETS = (0.01, 0.1, 1.0, 10.0)
VALUES = (0.0, 0.01, 0.010001, 0.5, 1.0, 9.99, 10.0, 11.0, 1e9, math.inf, -1.0, math.nan)


def _pair() -> tuple[CollectorRegistry, CollectorRegistry]:
    disable_created_metrics()
    return CollectorRegistry(auto_describe=True), CollectorRegistry(auto_describe=True)


def test_a_labelled_histogram_reads_as_prometheus_clients() -> None:
    ours_registry, theirs_registry = _pair()
    ours = metric_series.Histogram("x_seconds", "help text", ["route"], buckets=BUCKETS,
                                   registry=ours_registry)
    theirs = prometheus_client.Histogram("x_seconds", "help text", ["route"], buckets=BUCKETS,
                                         registry=theirs_registry)
    assert generate_latest(ours_registry) == generate_latest(theirs_registry)  # no series yet
    for i, value in enumerate(VALUES):
        route = ("pd", "local")[i % 2]
        ours.labels(route).observe(value)
        theirs.labels(route).observe(value)
    assert generate_latest(ours_registry) == generate_latest(theirs_registry)
    assert b'x_seconds_bucket{le="+Inf",route="pd"}' in generate_latest(ours_registry)


def test_an_unlabelled_histogram_exists_from_the_start_with_integer_buckets() -> None:
    ours_registry, theirs_registry = _pair()
    ours = metric_series.Histogram("turns", "turn index", [], buckets=(1, 2, 4),
                                   registry=ours_registry)
    theirs = prometheus_client.Histogram("turns", "turn index", buckets=(1, 2, 4),
                                         registry=theirs_registry)
    assert generate_latest(ours_registry) == generate_latest(theirs_registry)
    for value in (1, 2, 3, 4, 5, 1):
        ours.observe(value)
        theirs.observe(value)
    assert generate_latest(ours_registry) == generate_latest(theirs_registry)
    assert ours_registry.get_sample_value("turns_count") == 6
    assert ours_registry.get_sample_value("turns_bucket", {"le": "2.0"}) == 3


def test_a_counter_reads_as_prometheus_clients_and_refuses_what_it_refuses() -> None:
    ours_registry, theirs_registry = _pair()
    ours = metric_series.Counter("reqs", "requests", ["a", "b"], registry=ours_registry)
    theirs = prometheus_client.Counter("reqs", "requests", ["a", "b"], registry=theirs_registry)
    for labels, amount in ((("1", "x"), 1.0), (("2", "y"), 2.5), (("1", "x"), 1.0)):
        ours.labels(*labels).inc(amount)
        theirs.labels(*labels).inc(amount)
    assert generate_latest(ours_registry) == generate_latest(theirs_registry)
    assert ours_registry.get_sample_value("reqs_total", {"a": "1", "b": "x"}) == 2.0
    with pytest.raises(ValueError):
        ours.labels("1", "x").inc(-1)
    with pytest.raises(ValueError):
        ours.labels("only one")
    with pytest.raises(ValueError):  # a name registered twice, as prometheus_client refuses
        metric_series.Counter("reqs", "again", ["a", "b"], registry=ours_registry)

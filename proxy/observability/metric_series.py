"""The per-request Prometheus series (`proxy.observability.metrics`), without prometheus_client's
cost per call.

Each completion request counts itself in 3 counters and observes 4-5 histograms. With
prometheus_client every `inc` validates its amount and takes a lock, and every `observe` also
scans the buckets in Python and takes a lock per value it touches: ~2-3.5 us a call, 30-50 us
per request on this project's 2-core box (benchmarks/proxy_overhead, docs/scaling.md). The
proxy updates them from its event loop only, so here a series is plain numbers - a counter a
float, a histogram a count per bucket (found by bisection) and a sum - and the cumulative
buckets are built when /metrics is scraped. Each series is a collector of its own, registered
in the place of the prometheus_client metric it replaces: the exposition (names, help, label
order, `le` values, sample order) is the same text.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class CounterChild:
    """One labelled counter series."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        """Add amount (not negative, as prometheus_client's Counter)."""
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class HistogramChild:
    """One labelled histogram series: a count per bucket (the last is +Inf) and the sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count value in the first bucket whose bound is >= value (a NaN only in the sum,
        as prometheus_client does)."""
        self.sum += value
        if value == value:
            self.counts[bisect_left(self._bounds, value)] += 1


class Counter:
    """A labelled counter (`name` without `_total`), registered in registry."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry) -> None:
        self._name, self._doc, self._labelnames = name, documentation, tuple(labelnames)
        self._children: dict[tuple[str, ...], CounterChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> CounterChild:
        """The series of these label values (made on first use)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name} takes labels {self._labelnames}, got {values}")
            child = self._children[values] = CounterChild()
        return child

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._doc, labels=self._labelnames)
        for values, child in self._children.items():
            family.add_metric(values, child.value)
        yield family


class Histogram:
    """A histogram with labels (or none: then `observe` is its one series')."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self._name, self._doc, self._labelnames = name, documentation, tuple(labelnames)
        bounds = tuple(float(b) for b in buckets)
        self._bounds = bounds if bounds[-1] == float("inf") else (*bounds, float("inf"))
        self._le = tuple(floatToGoString(b) for b in self._bounds)
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        if not self._labelnames:
            self.observe = self.labels().observe
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        """The series of these label values (made on first use)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name} takes labels {self._labelnames}, got {values}")
            child = self._children[values] = HistogramChild(self._bounds)
        return child

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for values, child in self._children.items():
            total, buckets = 0, []
            for le, count in zip(self._le, child.counts, strict=True):
                total += count
                buckets.append((le, total))
            family.add_metric(values, buckets, child.sum)
        yield family

"""Observability: Prometheus metrics on a per-app registry, plus JSON counters for /stats.

Latency histograms follow vLLM's names with the `ppd_` prefix, labelled by route, so a
dashboard built for vLLM's `vllm:time_to_first_token_seconds` works on the proxy's view:
  ppd_time_to_first_token_seconds            request arrival -> first streamed chunk (or the
                                             whole answer when not streamed)
  ppd_request_time_per_output_token_seconds  (E2E - TTFT) / (completion tokens - 1), streams
  ppd_e2e_request_latency_seconds            request arrival -> last byte, complete replies
  ppd_followup_time_to_first_token_seconds   the TTFT of turns 2+ alone (the turns a P/D
                                             policy decides), by route
`ppd_fallbacks_total{route, reason}` counts the turns whose decided or forced route (`route`)
was not the one that served them, and why (`proxy.shared.explain.Fallback`).
Gauges read at scrape time: ppd_requests_in_flight, per role ppd_nodes and ppd_nodes_usable
(healthy, circuit not open: a role at 0 serves nothing), per node ppd_node_in_flight,
ppd_node_healthy, ppd_node_circuit_open, and - where the proxy scrapes the nodes' /metrics
(`proxy.observability.node_gauges`, policies that read the cluster) - what vLLM says of its load:
ppd_node_requests_running, ppd_node_requests_waiting, ppd_node_kv_cache_usage and the
reading's age, ppd_node_metrics_age_seconds. No `*_created` series (they only add noise).
The dashboard and alert rules in deploy/ read these names (docs/observability.md).

Route and reason labels are the enums' values; which routes exist, and which reasons count as
a route's fallbacks in /stats, come from `proxy.shared.routes.ROUTES` (read when an app's metrics
are made), so a route declared there is counted here with no change to this module.
"""

from __future__ import annotations

from collections import Counter as TallyCounter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from proxy.observability import metric_series
from proxy.observability.node_gauges import NodeMetrics
from proxy.shared import routes
from proxy.shared.vocabulary import Decision, Reason, Role, RouteKind

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0)
_TURN_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 16, 32, 64)


class ProxyMetrics:
    """Every counter the proxy keeps; each app owns one (no global registry)."""

    def __init__(self, policy: str, sessions_live: Callable[[], int]) -> None:
        disable_created_metrics()  # a process-wide switch of prometheus_client; idempotent
        self.registry = CollectorRegistry(auto_describe=True)
        self.policy = policy
        # The series every request touches are `proxy.observability.metric_series`' (plain numbers,
        # no lock
        # or validation per call); the rest are prometheus_client's own.
        self.requests = metric_series.Counter(
            "ppd_requests", "Completion requests by route and policy decision",
            ["endpoint", "route", "reason", "context_class", "workload", "qps"],
            registry=self.registry)
        self.responses = metric_series.Counter(
            "ppd_responses", "Completion responses by HTTP status", ["status"],
            registry=self.registry)
        self.turns = metric_series.Histogram("ppd_turn_index", "Turn index of each request", [],
                                             buckets=_TURN_BUCKETS, registry=self.registry)
        self.ttft = metric_series.Histogram(
            "ppd_time_to_first_token_seconds",
            "Proxy-side time to the first streamed chunk (non-streamed: to the whole answer), "
            "by route", ["route"], buckets=_TTFT_BUCKETS, registry=self.registry)
        self.tpot = metric_series.Histogram(
            "ppd_request_time_per_output_token_seconds",
            "Per streamed request: (E2E - TTFT) / (completion tokens - 1)",
            ["route"], buckets=_TPOT_BUCKETS, registry=self.registry)
        self.followup_ttft = metric_series.Histogram(
            "ppd_followup_time_to_first_token_seconds",
            "Proxy-side TTFT of turns 2+ (the turns a P/D policy decides), by route",
            ["route"], buckets=_TTFT_BUCKETS, registry=self.registry)
        self.fallbacks = metric_series.Counter(
            "ppd_fallbacks", "Turns not served by the route decided or forced for them "
            "(route), by why (reason)", ["route", "reason"], registry=self.registry)
        self.e2e = metric_series.Histogram(
            "ppd_e2e_request_latency_seconds",
            "Request arrival to the last byte of a complete reply, by route",
            ["route"], buckets=_E2E_BUCKETS, registry=self.registry)
        self.upstream_errors = Counter("ppd_upstream_errors", "Upstream failures by role and kind",
                                       ["role", "kind"], registry=self.registry)
        self.failovers = Counter(
            "ppd_failovers", "Failed legs after which another node was tried (if one was left)",
            ["role"], registry=self.registry)
        sessions = Gauge("ppd_sessions_live", "Live sessions", registry=self.registry)
        sessions.set_function(lambda: float(sessions_live()))
        self.read_back_tokens = Counter(
            "ppd_readback_tokens", "Tokens P read back from D instead of computing them "
            "(route readback)", registry=self.registry)
        self._read_back_tokens = 0
        self._routes: TallyCounter[str] = TallyCounter()
        self._reasons: TallyCounter[str] = TallyCounter()
        self._errors: TallyCounter[str] = TallyCounter()
        self._statuses: TallyCounter[int] = TallyCounter()
        self._failovers = 0
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._declared = tuple(routes.ROUTES.values())
        for spec in self._declared:  # every route's latency series exists from the start
            for histogram in (self.ttft, self.followup_ttft, self.tpot, self.e2e):
                self._child(histogram, spec.kind.value)

    def _child(self, metric: Any, *labels: str) -> Any:
        # A labelled series, found once: prometheus_client's labels() validates and locks on
        # every call (~1.5% of the proxy's CPU per request, benchmarks/proxy_overhead).
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def routed(self, endpoint: str, route: RouteKind, decision: Decision, turn: int,
               fallback: tuple[RouteKind, Reason] | None = None) -> None:
        """One request took `route` (the decision may have been overridden by failover);
        `fallback`: the route it was decided or forced for, and why that one did not serve."""
        cell = decision.cell
        # Labels and keys are the StrEnum members themselves (equal to and hashed as their
        # values): `.value` is a Python-level descriptor, 17 calls a request.
        self._child(self.requests, endpoint, route, decision.reason,
                    cell.context_class if cell else "", cell.workload if cell else "",
                    f"{cell.qps:g}" if cell else "").inc()
        self.turns.observe(turn)
        if fallback is not None:
            wanted, why = fallback
            self._child(self.fallbacks, wanted, why).inc()
        self._routes[route] += 1
        self._reasons[decision.reason] += 1

    def read_back(self, tokens: int) -> None:
        """A readback turn told P to read `tokens` tokens' KV from D."""
        self.read_back_tokens.inc(tokens)
        self._read_back_tokens += tokens

    def responded(self, status: int) -> None:
        """A completion response went out with this status."""
        self._child(self.responses, str(status)).inc()
        self._statuses[status] += 1

    def first_byte(self, route: RouteKind, seconds: float, turn: int = 1) -> None:
        """Proxy-side TTFT of one request (turn: its index in the conversation)."""
        self._child(self.ttft, route).observe(seconds)
        if turn > 1:
            self._child(self.followup_ttft, route).observe(seconds)

    def finished(self, route: RouteKind, e2e: float, ttft: float | None,
                 completion_tokens: int | None) -> None:
        """A complete reply: E2E, and TPOT when it was streamed (TTFT known) and had 2+
        tokens."""
        self._child(self.e2e, route).observe(e2e)
        if ttft is not None and completion_tokens is not None and completion_tokens > 1:
            tpot = max(e2e - ttft, 0.0) / (completion_tokens - 1)
            self._child(self.tpot, route).observe(tpot)

    def upstream_error(self, role: str, kind: str) -> None:
        """One upstream failure (before or during a response)."""
        self.upstream_errors.labels(role, kind).inc()
        self._errors[f"{role}:{kind}"] += 1

    def failover(self, role: str) -> None:
        """A turn was retried on another node of role."""
        self.failovers.labels(role).inc()
        self._failovers += 1

    def watch(self, nodes: Callable[[], list[dict[str, Any]]],
              requests_in_flight: Callable[[], int]) -> None:
        """Gauges read at scrape time: open requests, and per node its requests in flight,
        health and circuit (`nodes` gives the pool's snapshot)."""
        self.registry.register(_LiveGauges(nodes, requests_in_flight))

    def watch_node_load(self, latest: Callable[[], Mapping[str, NodeMetrics]],
                        clock: Callable[[], float]) -> None:
        """Gauges of each node's own /metrics as the proxy last scraped them
        (`proxy.observability.node_gauges.NodeGauges.latest`), with the reading's age."""
        self.registry.register(_NodeLoadGauges(latest, clock))

    def exposition(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)

    def stats(self) -> dict[str, Any]:
        """JSON counters; local_share is local / (local + pd) over routed requests; per route
        that has fallbacks (readback), how often it was served and why it fell back."""
        pd, local = self._routes[RouteKind.PD.value], self._routes[RouteKind.LOCAL.value]
        stats: dict[str, Any] = {
            "policy": self.policy,
            "requests": sum(self._routes.values()),
            "routes": dict(self._routes),
            "reasons": dict(self._reasons),
            "local_share": local / (pd + local) if pd + local else 0.0,
            "responses": {str(k): v for k, v in sorted(self._statuses.items())},
            "upstream_errors": dict(self._errors),
            "failovers": self._failovers,
        }
        for spec in self._declared:
            if spec.fallback_reasons:
                stats[spec.kind.value] = {
                    "served": self._routes[spec.kind.value],
                    "fallbacks": {reason.value: self._reasons[reason.value]
                                  for reason in spec.fallback_reasons
                                  if self._reasons[reason.value]}}
        stats.setdefault(RouteKind.READBACK.value, {})["tokens"] = self._read_back_tokens
        return stats


class _LiveGauges(Collector):
    """Gauges computed from the pool and the admission count when scraped (nodes come and go
    with discovery)."""

    def __init__(self, nodes: Callable[[], list[dict[str, Any]]],
                 requests_in_flight: Callable[[], int]) -> None:
        self._nodes = nodes
        self._requests = requests_in_flight

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("ppd_requests_in_flight",
                                "Completion requests admitted and not yet finished",
                                value=self._requests())
        in_flight = GaugeMetricFamily("ppd_node_in_flight", "Legs in flight on each node",
                                      labels=["node", "role"])
        healthy = GaugeMetricFamily("ppd_node_healthy", "1 while a node passes health checks",
                                    labels=["node", "role"])
        circuit = GaugeMetricFamily(
            "ppd_node_circuit_open",
            "1 while a node's circuit is not closed (open, or half-open awaiting its probe)",
            labels=["node", "role"])
        nodes = self._nodes()
        for node in nodes:
            labels = [node["url"], node["role"]]
            in_flight.add_metric(labels, node["in_flight"])
            healthy.add_metric(labels, 1.0 if node["healthy"] else 0.0)
            circuit.add_metric(labels, 0.0 if node["circuit"] == "closed" else 1.0)
        yield in_flight
        yield healthy
        yield circuit
        # Every role, 0 included: "no usable decode node" is a value an alert can read, not a
        # missing series.
        pool = GaugeMetricFamily("ppd_nodes", "Nodes in the pool, by role", labels=["role"])
        usable = GaugeMetricFamily(
            "ppd_nodes_usable", "Nodes that can take a leg now (healthy, circuit not open), "
            "by role", labels=["role"])
        for role in Role:
            members = [node for node in nodes if node["role"] == role.value]
            pool.add_metric([role.value], len(members))
            usable.add_metric([role.value], sum(
                1 for node in members if node["healthy"] and node["circuit"] != "open"))
        yield pool
        yield usable


class _NodeLoadGauges(Collector):
    """What each node's own /metrics said when last scraped (policies that read the cluster
    scrape them: `proxy.observability.node_gauges`), and how old that reading is."""

    def __init__(self, latest: Callable[[], Mapping[str, NodeMetrics]],
                 clock: Callable[[], float]) -> None:
        self._latest = latest
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        node = ["node"]
        running = GaugeMetricFamily("ppd_node_requests_running",
                                    "Requests in the node's batch (vllm:num_requests_running)",
                                    labels=node)
        waiting = GaugeMetricFamily("ppd_node_requests_waiting",
                                    "Requests queued on the node (vllm:num_requests_waiting)",
                                    labels=node)
        usage = GaugeMetricFamily("ppd_node_kv_cache_usage",
                                  "Share of the node's KV cache in use, 0-1 "
                                  "(vllm:kv_cache_usage_perc)", labels=node)
        age = GaugeMetricFamily("ppd_node_metrics_age_seconds",
                                "Seconds since the node's /metrics were last read", labels=node)
        now = self._clock()
        for url, reading in self._latest().items():
            running.add_metric([url], reading.running)
            waiting.add_metric([url], reading.waiting)
            if reading.kv_usage is not None:
                usage.add_metric([url], reading.kv_usage)
            age.add_metric([url], max(0.0, now - reading.at))
        yield from (running, waiting, usage, age)

"""An emulated node's /metrics under vLLM's metric names (one registry per node).

Gauges and prefix-cache counters are read from the engine at scrape time; latencies are
observed by the node as its clients see them. Names and buckets follow vLLM v1's
PrometheusStatLogger; `vllm:cache_config_info` carries the block size as tests expect, and
`ppd:emulated_info` says which cost preset timed the node. A node that publishes KV cache
events also exports `ppd:emulator_kv_events_dropped_total`, read from its publisher at scrape
time (`profiler.emulate.kv_publisher` says what it counts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from profiler.emulate.engine_interface import EngineStats
from profiler.emulate.runtime import Pacing

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class _EngineCollector(Collector):
    def __init__(self, labels: dict[str, str], stats: Callable[[], EngineStats],
                 pacing: Pacing, info: dict[str, str],
                 kv_events_dropped: Callable[[], int] | None) -> None:
        self._labels = labels
        self._stats = stats
        self._pacing = pacing
        self._info = info
        self._kv_events_dropped = kv_events_dropped

    def collect(self) -> Iterator[Metric]:
        names, values = list(self._labels), list(self._labels.values())
        s = self._stats()
        for name, doc, value in (
            ("vllm:num_requests_running", "Requests in model execution batches.", s.running),
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", s.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
             s.kv_usage),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=names)
            gauge.add_metric(values, value)
            yield gauge
        for name, doc, value in (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", s.prefix_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", s.prefix_hits),
            ("vllm:external_prefix_cache_queries",
             "External prefix cache queries from the KV connector, in tokens.",
             s.external_queries),
            ("vllm:external_prefix_cache_hits",
             "External prefix cache hits from the KV connector, in tokens.", s.external_hits),
            ("vllm:num_preemptions", "Cumulative number of preemptions.", s.preemptions),
            ("ppd:emulator_steps", "Engine steps run by the emulator.", self._pacing.steps),
            ("ppd:emulator_late_steps", "Steps delivered late (> 5 ms after their modelled end).",
             self._pacing.late_steps),
            ("ppd:emulator_lag_seconds", "Sum over steps of how late each was delivered.",
             self._pacing.total_lag_s),
            ("ppd:emulator_busy_seconds", "Modelled time spent in steps.", self._pacing.busy_s),
            ("ppd:emulator_tokens", "Tokens the emulated node delivered.", self._pacing.tokens),
        ):
            counter = CounterMetricFamily(name, doc, labels=names)
            counter.add_metric(values, value)
            yield counter
        if self._kv_events_dropped is not None:
            dropped = CounterMetricFamily(
                "ppd:emulator_kv_events_dropped",
                "KV event batches sent while a subscriber's queue was full (it lost them and "
                "replays): the times subscribers fell behind, a lower bound on the batches "
                "they lost.", labels=names)
            dropped.add_metric(values, self._kv_events_dropped())
            yield dropped
        worst = GaugeMetricFamily("ppd:emulator_max_lag_seconds",
                                  "The latest delivery of a step after its modelled end.",
                                  labels=names)
        worst.add_metric(values, self._pacing.max_lag_s)
        yield worst
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the KV cache config.",
                                 labels=[*names, *self._info])
        info.add_metric([*values, *self._info.values()], 1.0)
        yield info


class NodeMetrics:
    """The Prometheus registry of one emulated node (`kv_events_dropped`: its KV event
    publisher's count of dropped batches; None for a node that publishes none)."""

    def __init__(self, model: str, stats: Callable[[], EngineStats], pacing: Pacing,
                 cache_info: dict[str, str], preset: str,
                 kv_events_dropped: Callable[[], int] | None = None) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model, "engine": "0"}
        names = list(labels)
        self._labels = labels
        self.registry.register(_EngineCollector(labels, stats, pacing, cache_info,
                                                kv_events_dropped))

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=self.registry)

        def count(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*names, *extra], registry=self.registry)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token "
                         "in seconds.", _TTFT_BUCKETS).labels(**labels)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency "
                        "in seconds.", _ITL_BUCKETS).labels(**labels)
        self.tpot = hist("vllm:time_per_output_token_seconds", "Histogram of time per output "
                         "token in seconds.", _ITL_BUCKETS).labels(**labels)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency "
                        "in seconds.", _E2E_BUCKETS).labels(**labels)
        self.prompt_tokens = count("vllm:prompt_tokens", "Number of prefill tokens processed."
                                   ).labels(**labels)
        self.generation_tokens = count("vllm:generation_tokens", "Number of generation tokens "
                                       "processed.").labels(**labels)
        self._success = count("vllm:request_success", "Count of successfully processed "
                              "requests.", ("finished_reason",))
        for reason in ("stop", "length", "abort"):  # vLLM exports every reason from the start
            self._success.labels(**labels, finished_reason=reason)
        info = Counter("ppd:emulated", "This node is emulated; the preset timed it.",
                       [*names, "preset"], registry=self.registry)
        info.labels(**labels, preset=preset)

    def succeeded(self, finished_reason: str) -> None:
        self._success.labels(**self._labels, finished_reason=finished_reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

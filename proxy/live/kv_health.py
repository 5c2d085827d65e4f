"""KV-event health per node, for /stats and /metrics: is `live` seeing what the nodes hold?

Per node with a KV event source: events and batches received, the last sequence number and
how long ago it came, gaps (filled by replay, or forgotten), events rejected by reason
(`proxy.live.residency.Rejection`), and the residency index itself: sessions whose residency is
known, blocks resident, its capacity in blocks and about how much memory it holds. A `live`
proxy whose nodes show no events, or no known sessions, routes blind: its decisions then
carry the reason `live_blind`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from proxy.live.kv_subscriber import NodeSubscriber
from proxy.live.residency import Rejection


def node_health(subscriber: NodeSubscriber, now: float) -> dict[str, Any]:
    """One node's KV-event health as JSON (ages in seconds, None: nothing received yet)."""
    stats, index = subscriber.stats, subscriber.index
    last = stats.last_event_at
    return {
        "events": stats.events,
        "batches": stats.batches,
        "last_seq": None if stats.last_seq is None or stats.last_seq < 0 else stats.last_seq,
        "last_batch_age_s": None if last is None else round(now - last, 3),
        "gaps": stats.gaps,
        "gaps_replayed": stats.gaps_replayed,
        "batches_replayed": stats.replayed,
        "forgotten": index.resets,
        "restarts": stats.restarts,
        "rejected": {reason.value: index.rejected[reason] for reason in Rejection
                     if index.rejected[reason]},
        "sessions_known": index.num_sessions,
        "blocks_resident": index.num_blocks,
        "capacity_blocks": index.capacity,
        "evicted_over_capacity": index.evicted,
        "memory_bytes": index.memory_bytes(),
    }


def health(subscribers: list[NodeSubscriber],
           clock: Callable[[], float] = time.monotonic) -> dict[str, dict[str, Any]]:
    """Every node's health, by node URL (the `kv_events` key of /stats)."""
    now = clock()
    return {sub.source.url: node_health(sub, now) for sub in subscribers}


class KvEventCollector(Collector):
    """The same numbers as Prometheus series, read at scrape time, labelled by node."""

    def __init__(self, subscribers: list[NodeSubscriber],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._subscribers = subscribers
        self._clock = clock

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        node = ["node"]
        received = CounterMetricFamily("ppd_kv_events_received",
                                       "KV cache events received from each node", labels=node)
        batches = CounterMetricFamily("ppd_kv_event_batches",
                                      "KV event batches received from each node", labels=node)
        gaps = CounterMetricFamily(
            "ppd_kv_event_gaps", "Missed KV event batches, by outcome: replayed (filled from "
            "the node's replay socket) or forgotten (the node's residency became unknown)",
            labels=["node", "outcome"])
        rejected = CounterMetricFamily(
            "ppd_kv_events_rejected", "KV events rejected, by reason: impossible or malformed "
            "ones forgot the node's residency; implausible batches (numbered or stamped far "
            "ahead) were dropped whole", labels=["node", "reason"])
        last_seq = GaugeMetricFamily("ppd_kv_events_last_seq",
                                     "Sequence number of the last KV event batch", labels=node)
        age = GaugeMetricFamily("ppd_kv_events_last_age_seconds",
                                "Seconds since the last KV event batch arrived", labels=node)
        sessions = GaugeMetricFamily(
            "ppd_kv_residency_sessions", "Sessions whose residency on the node is known",
            labels=node)
        blocks = GaugeMetricFamily("ppd_kv_residency_blocks",
                                   "Blocks the node holds, as its events say", labels=node)
        capacity = GaugeMetricFamily(
            "ppd_kv_residency_capacity_blocks",
            "The node's KV capacity in blocks: the residency index's bound", labels=node)
        memory = GaugeMetricFamily("ppd_kv_residency_memory_bytes",
                                   "About how much memory the node's residency index holds",
                                   labels=node)
        now = self._clock()
        for sub in self._subscribers:
            url, stats, index = sub.source.url, sub.stats, sub.index
            received.add_metric([url], stats.events)
            batches.add_metric([url], stats.batches)
            gaps.add_metric([url, "replayed"], stats.gaps_replayed)
            gaps.add_metric([url, "forgotten"], stats.gaps - stats.gaps_replayed)
            for reason in Rejection:
                rejected.add_metric([url, reason.value], index.rejected[reason])
            if stats.last_seq is not None and stats.last_seq >= 0:
                last_seq.add_metric([url], stats.last_seq)
            if stats.last_event_at is not None:
                age.add_metric([url], now - stats.last_event_at)
            sessions.add_metric([url], index.num_sessions)
            blocks.add_metric([url], index.num_blocks)
            capacity.add_metric([url], index.capacity)
            memory.add_metric([url], index.memory_bytes())
        yield from (received, batches, gaps, rejected, last_seq, age, sessions, blocks,
                    capacity, memory)

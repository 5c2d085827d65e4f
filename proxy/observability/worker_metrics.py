"""Metrics of N worker processes behind one port, each sample labelled with its `worker`.

A scrape lands on whichever worker the kernel picks, so every worker answers for all: each
writes its own exposition to a shared directory (at each scrape and every PUBLISH_INTERVAL_S),
and /metrics on any worker merges every worker's latest file, adding `worker="N"` to each
sample. The scraped worker's numbers are current, the others' at most PUBLISH_INTERVAL_S old.
Counters stay per worker (sum them in PromQL: `sum without (worker) (...)`); gauges computed
from shared state, such as `ppd_sessions_live` from the store, are the same in every worker.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from proxy.observability.prometheus_text import families as page_families

PUBLISH_INTERVAL_S = 1.0
_SUFFIX = ".prom"


class WorkerMetrics:
    """One worker's view: publishes its own exposition, merges everyone's."""

    def __init__(self, directory: Path, worker: int, own: Callable[[], bytes]) -> None:
        self.directory = directory
        self.worker = worker
        self._own = own
        self._path = directory / f"worker-{worker}{_SUFFIX}"

    def publish(self) -> bytes:
        """Write this worker's exposition where the others read it (atomically)."""
        data = self._own()
        tmp = self._path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self._path)
        return data

    def retire(self) -> None:
        """Remove this worker's file (it stopped)."""
        self._path.unlink(missing_ok=True)

    def exposition(self) -> bytes:
        """Every worker's metrics, each sample labelled with its worker."""
        texts = {self.worker: self.publish()}
        for path in sorted(self.directory.glob(f"worker-*{_SUFFIX}")):
            worker = int(path.stem.removeprefix("worker-"))
            if worker not in texts:
                try:
                    texts[worker] = path.read_bytes()
                except FileNotFoundError:  # that worker just retired
                    continue
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Merged(texts))
        return generate_latest(registry)


class _Merged(Collector):
    """Families from several expositions, one family per name, samples labelled by worker."""

    def __init__(self, texts: dict[int, bytes]) -> None:
        self._texts = texts

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for worker, text in sorted(self._texts.items()):
            for family in page_families(text.decode()):
                merged = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type,
                                        family.unit))
                merged.samples.extend(
                    Sample(s.name, {**s.labels, "worker": str(worker)}, s.value, s.timestamp,
                           s.exemplar) for s in family.samples)
        yield from families.values()

"""Which conversations a replay sends: a trace file, the sharegpt package's file, or a named
synthetic workload - described by a `DatasetSpec`, loaded by `load_dataset`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from profiler.traces.conversation import Conversation
from profiler.traces.formats import TraceFormat
from profiler.traces.loader import TraceFilter, load_trace, sharegpt_package_file
from profiler.traces.synthetic import named_workload
from proxy.tokens import TokenCounter

SYNTHETIC_PREFIX = "synthetic:"


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    """A dataset: a trace path, `sharegpt`, or `synthetic:NAME`; how to read and filter it.

    seed: the synthetic workload's seed, or the trace sample's.
    """

    source: str
    format: TraceFormat = TraceFormat.AUTO
    filters: TraceFilter = field(default_factory=TraceFilter)
    seed: int = 0


def load_dataset(spec: DatasetSpec, tokenizer: TokenCounter, count: int) -> list[Conversation]:
    """Up to count conversations of the dataset (a ValueError when none passes the filters)."""
    if spec.source.startswith(SYNTHETIC_PREFIX):
        name = spec.source.removeprefix(SYNTHETIC_PREFIX)
        return named_workload(name, count, seed=spec.seed, tokenizer=tokenizer)
    path = sharegpt_package_file() if spec.source == "sharegpt" else Path(spec.source)
    trace = load_trace(path, fmt=spec.format, tokenizer=tokenizer, filters=spec.filters,
                       sample=count, seed=spec.seed)
    if not trace.conversations:
        raise ValueError(f"no conversation of {path} passes the filters "
                         f"({trace.records} records, format {trace.format})")
    return trace.conversations

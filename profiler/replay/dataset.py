"""Which conversations a replay sends: a trace file, the sharegpt package's file, or a named
synthetic workload - described by a `DatasetSpec`, loaded by `load_dataset`."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from profiler.traces.conversation import Conversation
from profiler.traces.formats import TraceFormat
from profiler.traces.loader import TraceFilter, load_trace, sharegpt_package_file
from profiler.traces.synthetic import named_workload, synthetic_names
from proxy.shared.tokens import TokenCounter

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
    if not path.exists():
        raise ValueError(not_found_message(spec.source))
    trace = load_trace(path, fmt=spec.format, tokenizer=tokenizer, filters=spec.filters,
                       sample=count, seed=spec.seed)
    if not trace.conversations:
        raise ValueError(f"no conversation of {path} passes the filters "
                         f"({trace.records} records, format {trace.format})")
    return trace.conversations


def not_found_message(source: str) -> str:
    """--dataset names no file: what it may have meant (a synthetic workload, sharegpt)."""
    names = [f"{SYNTHETIC_PREFIX}{name}" for name in synthetic_names()]
    guesses = []
    if source in synthetic_names():
        guesses.append(f"{SYNTHETIC_PREFIX}{source}")
    bare = [name.removeprefix(SYNTHETIC_PREFIX) for name in names]
    guesses += [f"{SYNTHETIC_PREFIX}{name}" for name in difflib.get_close_matches(source, bare)]
    guesses += difflib.get_close_matches(source, ["sharegpt"])
    guesses = list(dict.fromkeys(guesses))
    hint = f"did you mean {' or '.join(guesses[:3])}? " if guesses else ""
    return (f"--dataset {source}: trace file not found. {hint}--dataset takes a trace file "
            f"(JSON, JSONL, Parquet), `sharegpt`, or synthetic:NAME (see `ppd replay --help`)")

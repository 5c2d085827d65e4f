"""Conversation traces: one model, loaders for the public chat datasets, synthetic workloads."""

from profiler.traces.conversation import Conversation, Turn
from profiler.traces.formats import TraceFormat
from profiler.traces.loader import (
    LoadedTrace,
    TraceFilter,
    load_conversations,
    load_trace,
    sharegpt_package_file,
)
from profiler.traces.records import TraceFileError
from profiler.traces.synthetic import (
    multi_turn_conversations,
    named_workload,
    two_turn_conversations,
)

__all__ = [
    "Conversation",
    "LoadedTrace",
    "TraceFileError",
    "TraceFilter",
    "TraceFormat",
    "Turn",
    "load_conversations",
    "load_trace",
    "multi_turn_conversations",
    "named_workload",
    "sharegpt_package_file",
    "two_turn_conversations",
]

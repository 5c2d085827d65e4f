"""Trace replay: an open-loop multi-turn client, per-request metrics, summaries and outputs."""

from profiler.replay.client import ReplayConfig, ReplayError, ReplayResult, replay
from profiler.traces.arrivals import arrival_times
from profiler.traces.request_records import RequestRecord

__all__ = [
    "ReplayConfig",
    "ReplayError",
    "ReplayResult",
    "RequestRecord",
    "arrival_times",
    "replay",
]

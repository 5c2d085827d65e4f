"""Trace replay: an open-loop multi-turn client, per-request metrics, summaries and outputs."""

from profiler.replay.client import ReplayConfig, ReplayError, ReplayResult, replay

__all__ = [
    "ReplayConfig",
    "ReplayError",
    "ReplayResult",
    "replay",
]

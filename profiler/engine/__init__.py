"""A vLLM-like engine model with GPU and CPU step-cost presets (issue #12, parts 1-2).

No HTTP here and nothing in `proxy/` imports it. `aiconfigurator-core` (the GPU presets) is
the optional extra `ppd[sim]`, imported only when an `h100:...`-style preset is first used.
"""

from profiler.engine.batch import BatchShape
from profiler.engine.config import EngineConfig, SchedulePolicy
from profiler.engine.cost import CostModel, LinearCost
from profiler.engine.drive import Outcome, SimResult, simulate
from profiler.engine.engine import Engine, EngineStats, StepResult
from profiler.engine.prefix_cache import CacheObserver, PrefixCache, block_hashes
from profiler.engine.presets import load_cost
from profiler.engine.requests import Phase, Request, RequestRejected, Sequence
from profiler.engine.transfer import Link, ModelShape, SharedLink, load_link, load_model_shape

__all__ = [
    "BatchShape",
    "CacheObserver",
    "CostModel",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "LinearCost",
    "Link",
    "ModelShape",
    "Outcome",
    "Phase",
    "PrefixCache",
    "Request",
    "RequestRejected",
    "SchedulePolicy",
    "Sequence",
    "SharedLink",
    "SimResult",
    "StepResult",
    "block_hashes",
    "load_cost",
    "load_link",
    "load_model_shape",
    "simulate",
]

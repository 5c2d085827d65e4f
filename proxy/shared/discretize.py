"""One discretization of workloads, shared by the profiler (which writes tables) and the proxy
(which reads them), so a cell means the same thing on both sides.

A cell is (context class, workload shape, qps point):
- context class from the cached context n_ctx: small <= 512 < large <= 4096 < huge;
- workload shape: the nearest of the PPD paper's nine turn-2 shapes (n_in, n_out), by distance
  in log space, since the shapes span two orders of magnitude;
- qps: the nearest profiled load point.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import NamedTuple


class ContextClass(enum.StrEnum):
    SMALL = "small"
    LARGE = "large"
    HUGE = "huge"


SMALL_MAX_CONTEXT = 512
LARGE_MAX_CONTEXT = 4096


class Shape(NamedTuple):
    n_in: int
    n_out: int


# The nine turn-2 shapes of the PPD paper (new input tokens, output tokens).
WORKLOAD_SHAPES: dict[str, Shape] = {
    "tiny": Shape(16, 32),
    "short_gen": Shape(32, 256),
    "long_gen": Shape(32, 512),
    "very_long_gen": Shape(64, 1024),
    "small_bal": Shape(64, 64),
    "mid_bal": Shape(128, 128),
    "mid_paste": Shape(256, 64),
    "big_paste": Shape(512, 64),
    "huge_paste": Shape(1024, 32),
}

# Turn-1 profiles the profiler uses to reach each context class (input, output tokens).
# small and large are the PPD paper's two turn-1 profiles (context 256 and 2,048 tokens after
# turn 1). huge has no profile in the paper: 8192/1024 leaves D holding 9,216 tokens, inside
# the spread of ShareGPT's follow-up turns past 4,096 tokens of context (median ~10.6k over a
# 600-conversation sample, ~6.1k in the simulated 16 conversations/s run; 4096/1024 would sit
# at the bottom of both), while the 1,024 output tokens keep turn 1 as long as large's. A real
# cluster needs max_model_len >= 9,216 + turn 2 for it (vLLM-CPU's default 4,096 is not).
TURN1_PROFILES: dict[ContextClass, Shape] = {
    ContextClass.SMALL: Shape(128, 128),
    ContextClass.LARGE: Shape(1024, 1024),
    ContextClass.HUGE: Shape(8192, 1024),
}

# The paper's turn-1 profiles: what `ppd profile` measures by default, the synthetic `mixed`
# and `multi-N` workloads draw from, and `ppd sim grid --datasets paper` spans (2 x 9 shapes).
PAPER_CONTEXTS: tuple[ContextClass, ...] = (ContextClass.SMALL, ContextClass.LARGE)


class Cell(NamedTuple):
    context_class: ContextClass
    workload: str
    qps: float


def context_class(n_ctx: int) -> ContextClass:
    """Class of the context D already holds."""
    if n_ctx <= SMALL_MAX_CONTEXT:
        return ContextClass.SMALL
    if n_ctx <= LARGE_MAX_CONTEXT:
        return ContextClass.LARGE
    return ContextClass.HUGE


def workload_shape(n_in: int, n_out: int) -> str:
    """Name of the profiled shape nearest to (n_in, n_out) in log space (ties: first listed)."""
    x, y = math.log2(max(n_in, 1)), math.log2(max(n_out, 1))
    return min(
        WORKLOAD_SHAPES,
        key=lambda name: (x - math.log2(WORKLOAD_SHAPES[name].n_in)) ** 2
        + (y - math.log2(WORKLOAD_SHAPES[name].n_out)) ** 2,
    )


def nearest_qps(qps: float, profiled: Sequence[float]) -> float:
    """The profiled load point nearest to qps (ties go to the lower, more common load)."""
    if not profiled:
        raise ValueError("no profiled qps points")
    return min(sorted(profiled), key=lambda point: abs(point - qps))


def classify(n_ctx: int, n_in: int, n_out: int, qps: float, profiled_qps: Sequence[float]) -> Cell:
    """The table cell a turn falls in."""
    return Cell(context_class(n_ctx), workload_shape(n_in, n_out), nearest_qps(qps, profiled_qps))

"""The answer a grid owes its reader: would per-turn routing help on this cluster, and by how
much? Printed at the end of `ppd sim grid` and of `ppd sim paper`'s report.

Two lines' worth, from the same scores as the paper's comparison (`paper.scores`: a policy's
w_ttft * turn-2+ TTFT gain - w_tpot * TPOT loss against P->D in its cell, success-guarded):
- the best fixed route per cell (pd, x=F, local, readback) against P->D: its turn-2+ TTFT and TPOT
  change (median over cells, and the range), and how often P->D itself was best;
- each adaptive policy in the grid (ppd*, live*), on its own weights: in how many cells it beat
  every fixed policy by more than the tolerance (and by how much), tied the best, or trailed.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from profiler.simulator.paper import FIXED, SUCCESS_GUARD, X0, cell_key, scores
from proxy.policies import live as live_policy
from proxy.policies import ppd as ppd_policy
from proxy.policies import readback as readback_policy

TOLERANCE = 0.01  # score margin within which two policies tie (as `paper.ppd_versus_fixed`)
# The fixed routes: the paper's x values, and P reading the history back from D (issue 31's
# third route) when a grid runs it alone.
FIXED_ROUTES = (*FIXED, readback_policy.NAME)
_WTPOT = re.compile(r"-wtpot([\d.]+)$")
_ADAPTIVE = (ppd_policy.NAME, live_policy.NAME)


def verdict_lines(grid: pd.DataFrame, tolerance: float = TOLERANCE) -> list[str]:
    """The verdict, one finding a line, each starting `verdict:`."""
    if grid.empty or X0 not in set(grid["policy"]):
        return ["verdict: no P->D (pd) runs in this grid: nothing to measure the routes "
                "against (add pd to --policies)"]
    lines = [_best_fixed_line(grid)]
    adaptive = sorted(p for p in set(grid["policy"]) if str(p).startswith(_ADAPTIVE))
    lines += [_adaptive_line(grid, label, tolerance) for label in adaptive]
    if not adaptive:
        lines.append("verdict: no ppd or live runs in this grid: add them to --policies to "
                     "see whether per-turn routing beats the best fixed route")
    return lines


def _best_fixed_line(grid: pd.DataFrame) -> str:
    scored = scores(grid)
    scored = scored[scored["policy"].isin(FIXED_ROUTES) & (scored["score"] > -math.inf)]
    key = cell_key(grid)
    best = scored.loc[scored.groupby(key)["score"].idxmax()]
    if best.empty:
        return "verdict: no cell has a scored fixed route"
    ttft = (best["turn2plus_ttft_ms_mean"] / best["turn2plus_ttft_ms_mean_ref"] - 1) * 100
    tpot = (best["tpot_ms_mean"] / best["tpot_ms_mean_ref"] - 1) * 100
    pd_best = int((best["policy"] == X0).sum())
    return (f"verdict: the best fixed route per cell against P->D (w_tpot 1, {len(best)} "
            f"cells): turn-2+ TTFT {_change(ttft)}, TPOT {_change(tpot)}; P->D itself was "
            f"best in {pd_best} of {len(best)} cells")


def _adaptive_line(grid: pd.DataFrame, label: str, tolerance: float) -> str:
    match = _WTPOT.search(label)
    w_tpot = float(match.group(1)) if match else 1.0
    scored = scores(grid, 1.0, w_tpot)
    wide = scored.pivot_table(index=cell_key(grid), columns="policy", values="score",
                              aggfunc="first")
    fixed = [p for p in FIXED_ROUTES if p in wide.columns]
    if label not in wide.columns or not fixed:
        return f"verdict: {label}: no cell to compare with a fixed route"
    cells = wide[[label, *fixed]].dropna()
    margin = cells[label] - cells[fixed].max(axis=1)
    beat = margin[margin > tolerance]
    trail = margin[margin < -tolerance]
    failing = int((trail == -math.inf).sum())  # more failed requests than the best (guard)
    slower = trail[trail > -math.inf]
    tied = len(margin) - len(beat) - len(trail)
    name = f"{label} (w_tpot {w_tpot:g})"
    if beat.empty and trail.empty:
        return (f"verdict: {name} tied the best fixed policy in {tied} of {len(margin)} "
                "cells and beat it in none")
    parts = [f"beat every fixed policy in {len(beat)} of {len(margin)} cells"
             + (f" (score +{beat.median():.2f} median, up to +{beat.max():.2f})"
                if len(beat) else "")]
    parts.append(f"tied the best in {tied}")
    why = ([f"by up to {slower.min():.2f}"] if len(slower) else []) + (
        [f"{failing} by a success rate over {SUCCESS_GUARD * 100:.0f} points below the best"]
        if failing
        else [])
    parts.append(f"trailed it in {len(trail)}" + (f" ({'; '.join(why)})" if why else ""))
    return f"verdict: {name} " + ", ".join(parts)


def _change(values: pd.Series) -> str:
    values = values.replace([math.inf, -math.inf], math.nan).dropna()
    if values.empty:
        return "-"
    return (f"{values.median():+.1f}% median ({values.min():+.1f}% to "
            f"{values.max():+.1f}%)")

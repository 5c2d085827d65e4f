"""The PPD paper's tables from a `ppd sim grid` table, beside the paper's own figures.

    ppd sim paper runs/paper-grid.parquet --out docs/paper-reproduction

(the command line is `profiler.simulator.cli`; the paper's own figures, `paper_figures`).
Reads the tidy grid (one row per run: layout, dataset, qps, policy, metrics) and writes
markdown tables and PNG plots:
- Table 1: turn-2 TTFT change from x=0 (`pd`) to x=1 (`local`) per P/D layout and load band;
- Table 2: the share of (workload, qps) points each mode wins on T2 TTFT, TPOT, throughput,
  over every fixed configuration (4R replica, and each P/D layout at x = 0, 0<x<1, 1);
- Table 4: failure rates (the 30 s timeout) at high load, mean over the workloads;
- ppd against the fixed policies: the weighted score per cell (below), where ppd wins/loses;
- plots: winner map, turn-2+ TTFT vs qps per policy, the w_tpot trade-off, KV bytes moved.

Weighted score of a policy in a cell (layout, workload, qps), against x=0 in that cell, the
decision table's own formula: w_ttft * (T2TTFT_pd - T2TTFT) / T2TTFT_pd
- w_tpot * (TPOT - TPOT_pd) / TPOT_pd. A policy whose success rate trails the cell's best by
more than 5 points scores -inf (the table's success guard). Higher is better.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from profiler.simulator.grid import PAPER_FIXED, PAPER_LAYOUTS, paper_datasets
from profiler.simulator.paper_figures import PAPER_TABLE1, PAPER_TABLE2, PAPER_TABLE4
from proxy.policies import ppd as ppd_policy
from proxy.policies import registry
from proxy.policies import replica as replica_policy

BANDS = (("low (0.5-2)", 0.5, 2.0), ("medium (4-8)", 4.0, 8.0), ("high (12-20)", 12.0, 20.0))
TABLE4_QPS = (8.0, 12.0, 16.0, 20.0)
SUCCESS_GUARD = 0.05
FIXED = PAPER_FIXED
X0, X1 = registry.fixed_label(0.0), registry.fixed_label(1.0)  # pd and local
REPLICA = replica_policy.NAME
_MODE_X = "x="  # the paper names a fixed mode by its x

def mode_of(policy: str) -> str:
    """The paper's mode of a fixed policy: replica, x=0, 0<x<1 or x=1 (ppd: itself)."""
    share = registry.local_share(policy)
    if policy == REPLICA or share is None:
        return policy
    return f"{_MODE_X}{share:g}" if share in (0.0, 1.0) else "0<x<1"


def policy_of(mode: str) -> str:
    """The policy a paper mode names (`x=0`: pd, `x=1`: local, `x=0.5`); other text as is."""
    try:
        return registry.fixed_label(float(mode.removeprefix(_MODE_X)))
    except ValueError:
        return mode


def _workload(dataset: str) -> str:
    return dataset.removeprefix("synthetic:")


def coverage_notes(grid: pd.DataFrame) -> list[str]:
    """What this grid lacks or adds against the paper's setup, and which tables it cannot
    fill (and why): said in tables.md and on stderr, so a partial grid never reads as the
    paper's."""
    notes = []
    layouts = set(grid["layout"])
    missing_layouts = [layout for layout in PAPER_LAYOUTS if layout not in layouts]
    if missing_layouts:
        notes.append(f"the grid lacks the paper's layouts {', '.join(missing_layouts)}: "
                     "their rows are left out")
    ours = {_workload(dataset) for dataset in grid["dataset"]}
    paper = [_workload(dataset) for dataset in paper_datasets()]
    missing = [name for name in paper if name not in ours]
    if missing:
        listed = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4
                                           else "")
        notes.append(f"the grid lacks {len(missing)} of the paper's {len(paper)} workloads "
                     f"({listed}): every mean below is over the workloads it has")
    extra = sorted(ours - set(paper))
    if extra:
        notes.append(f"the grid has workloads outside the paper's ({', '.join(extra)}): they "
                     "are averaged in beside the paper's figures, which are over its 18 only")
    for table, why in omitted_tables(grid).items():
        notes.append(f"{table} is left out: {why}")
    return notes


def omitted_tables(grid: pd.DataFrame) -> dict[str, str]:
    """The paper's tables this grid cannot fill -> why."""
    policies = set(grid["policy"])
    omitted = {}
    if not {X0, X1} <= policies:
        omitted["Table 1"] = "it needs runs of both policies pd (x=0) and local (x=1)"
    if REPLICA not in policies:
        why = "it needs replica runs (a 4R layout) to set against the P/D modes"
        omitted["Table 2"] = why
        omitted["Table 4"] = why
    elif not set(TABLE4_QPS) & set(grid["qps"]):
        omitted["Table 4"] = (f"it needs runs at the paper's high loads (QPS "
                              f"{', '.join(f'{q:g}' for q in TABLE4_QPS)})")
    return omitted


def table1(grid: pd.DataFrame) -> pd.DataFrame:
    """Mean over workloads and band qps of (T2TTFT_local - T2TTFT_pd) / T2TTFT_pd, in %, for
    the P/D layouts the grid simulated (the paper's first)."""
    key = ["layout", "dataset", "qps"]
    # reindex: pivot_table drops a policy none of whose runs has a TTFT (all failed)
    ttft = grid.pivot_table(index=key, columns="policy", values="turn2plus_ttft_ms_mean"
                            ).reindex(columns=[X0, X1])
    change = ((ttft[X1] - ttft[X0]) / ttft[X0] * 100).rename("change").reset_index()
    simulated = set(change.dropna()["layout"])
    layouts = [layout for layout in PAPER_TABLE1 if layout in simulated] + sorted(
        simulated - set(PAPER_TABLE1))
    rows = {}
    for layout in layouts:
        part = change[change["layout"] == layout]
        rows[layout] = [part[(part["qps"] >= lo) & (part["qps"] <= hi)]["change"].mean()
                        for _, lo, hi in BANDS]
    return pd.DataFrame.from_dict(rows, orient="index", columns=[b for b, _, _ in BANDS])


def table2(grid: pd.DataFrame) -> tuple[pd.DataFrame, float]:
    """Share (%) of (workload, qps) points each mode wins, and the share of points whose
    best configuration differs between T2 TTFT and TPOT."""
    fixed = grid[grid["policy"].isin((REPLICA, *FIXED))].copy()
    fixed["config"] = fixed["layout"] + "/" + fixed["policy"]
    fixed["mode"] = fixed["policy"].map(mode_of)
    ok = fixed[fixed["success_rate"] >= 1.0 - SUCCESS_GUARD]
    metrics = (("T2 TTFT", "turn2plus_ttft_ms_mean", True), ("TPOT", "tpot_ms_mean", True),
               ("throughput", "output_tok_s", False))
    wins: dict[str, dict[str, float]] = {}
    best_config: dict[str, pd.Series] = {}
    for name, column, lower in metrics:
        scored = ok.dropna(subset=[column])
        index = (scored.groupby(["dataset", "qps"])[column].idxmin() if lower
                 else scored.groupby(["dataset", "qps"])[column].idxmax())
        winners = scored.loc[index]
        best_config[name] = winners.set_index(["dataset", "qps"])["config"]
        share = winners["mode"].value_counts(normalize=True) * 100
        wins[name] = {mode: float(share.get(mode, 0.0)) for mode in PAPER_TABLE2}
    frame = pd.DataFrame(wins)
    frame["average"] = frame.mean(axis=1)
    joined = pd.concat([best_config["T2 TTFT"], best_config["TPOT"]], axis=1).dropna()
    differ = float((joined.iloc[:, 0] != joined.iloc[:, 1]).mean() * 100) if len(joined) else 0.0
    return frame, differ


def table4(grid: pd.DataFrame) -> pd.DataFrame:
    """Failure rate (%) = 1 - success rate, mean over workloads, at the paper's high loads."""
    rows = {}
    for (layout, policy) in PAPER_TABLE4:
        part = grid[(grid["layout"] == layout) & (grid["policy"] == policy)]
        if part.empty:
            continue  # not simulated: no row, rather than a row of blanks
        rows[f"{layout} {mode_of(policy)}"] = [
            (1.0 - part[part["qps"] == q]["success_rate"]).mean() * 100 for q in TABLE4_QPS]
    return pd.DataFrame.from_dict(rows, orient="index",
                                  columns=[f"QPS {q:g}" for q in TABLE4_QPS])


def cell_key(grid: pd.DataFrame) -> list[str]:
    """The columns that name a cell: layout, workload and load, and the seed when the grid
    holds several (each seed's runs share conversations and arrivals, so a policy is scored
    against the x=0 run of its own seed)."""
    key = ["layout", "dataset", "qps"]
    if "seed" in grid.columns and grid["seed"].nunique() > 1:
        key.append("seed")
    return key


def scores(grid: pd.DataFrame, w_ttft: float = 1.0, w_tpot: float = 1.0) -> pd.DataFrame:
    """Every P/D run's weighted score against x=0 in its cell (see the module docstring)."""
    pd_runs = grid[grid["layout"] != "4R"]
    key = cell_key(grid)
    ref = pd_runs[pd_runs["policy"] == X0].set_index(key)[
        ["turn2plus_ttft_ms_mean", "tpot_ms_mean"]].add_suffix("_ref")
    best_success = pd_runs.groupby(key)["success_rate"].max().rename("best_success")
    frame = pd_runs.join(ref, on=key).join(best_success, on=key)
    score = (w_ttft * (frame["turn2plus_ttft_ms_mean_ref"] - frame["turn2plus_ttft_ms_mean"])
             / frame["turn2plus_ttft_ms_mean_ref"]
             - w_tpot * (frame["tpot_ms_mean"] - frame["tpot_ms_mean_ref"])
             / frame["tpot_ms_mean_ref"])
    guard = frame["success_rate"] < frame["best_success"] - SUCCESS_GUARD
    frame["score"] = score.where(~guard, -math.inf)
    return frame


def ppd_versus_fixed(grid: pd.DataFrame, ppd: str = ppd_policy.NAME, w_tpot: float = 1.0,
                     tolerance: float = 0.01) -> dict[str, Any]:
    """Where `ppd` stands against the best fixed x per cell (on its own weights)."""
    scored = scores(grid, 1.0, w_tpot)
    key = cell_key(grid)
    wide = scored.pivot_table(index=key, columns="policy", values="score", aggfunc="first")
    if ppd not in wide.columns:
        return {}
    fixed = [p for p in FIXED if p in wide.columns]
    best_fixed = wide[fixed].max(axis=1)
    margin = wide[ppd] - best_fixed
    cells = margin.dropna()
    strictly = (wide[ppd].to_frame().values > wide[fixed].values + tolerance).all(axis=1)
    losses = cells[cells < -tolerance].sort_values()
    return {
        "cells": len(cells),
        "no_worse": float((cells >= -tolerance).mean()) if len(cells) else math.nan,
        "strictly_better_somewhere": int(strictly.sum()),
        "wins": margin[strictly].sort_values(ascending=False),
        "worst_losses": losses.head(8),
        "by_layout": (cells >= -tolerance).groupby(level="layout").mean(),
    }


def policy_means(grid: pd.DataFrame) -> pd.DataFrame:
    """Per layout and policy: means over cells of the headline metrics."""
    columns = ["turn2plus_ttft_ms_mean", "tpot_ms_mean", "output_tok_s", "success_rate",
               "local_share", "kv_bytes_moved"]
    frame = grid.groupby(["layout", "policy"])[columns].mean()
    frame["kv_gb_moved"] = frame.pop("kv_bytes_moved") / 1e9
    return frame


def markdown(frame: pd.DataFrame, digits: int = 1) -> str:
    """A DataFrame as a GitHub table (no tabulate dependency)."""
    header = [frame.index.name or "", *map(str, frame.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, row in frame.iterrows():
        label = " / ".join(map(str, index)) if isinstance(index, tuple) else str(index)
        cells = [_fmt(value, digits) for value in row]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines)


def _fmt(value: Any, digits: int) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def side_by_side(ours: pd.DataFrame, paper: Mapping[Any, tuple[float, ...]]) -> pd.DataFrame:
    """Ours and the paper's per cell, as `ours (paper)` strings."""
    out = ours.copy().astype(object)
    for index in ours.index:
        theirs = paper.get(index) or paper.get(_paper_key(index))
        for j, column in enumerate(ours.columns):
            value = ours.loc[index, column]
            mine = "-" if pd.isna(value) else f"{value:.1f}"
            out.loc[index, column] = mine if theirs is None else f"{mine} ({theirs[j]:g})"
    return out


def _paper_key(label: Any) -> Any:
    if isinstance(label, str) and " " in label:
        layout, mode = label.split(" ", 1)
        return (layout, policy_of(mode))
    return label

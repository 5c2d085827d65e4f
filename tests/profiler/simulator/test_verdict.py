"""The verdict line a grid report ends with: the best fixed route against P->D, and whether
ppd / live beat every fixed policy anywhere (how often, by how much)."""

from __future__ import annotations

import pandas as pd

from profiler.simulator.verdict import verdict_lines


def _grid(policies: dict[str, list[tuple[float, float]]]) -> pd.DataFrame:
    """One row per (policy, cell): turn-2+ TTFT and TPOT per cell, two cells on 1P3D."""
    rows = []
    for policy, cells in policies.items():
        for qps, (ttft, tpot) in zip((1.0, 8.0), cells, strict=True):
            rows.append({"layout": "1P3D", "dataset": "small-tiny", "qps": qps,
                         "policy": policy, "turn2plus_ttft_ms_mean": ttft,
                         "tpot_ms_mean": tpot, "success_rate": 1.0})
    return pd.DataFrame(rows)


def test_a_policy_that_matches_the_best_fixed_route_ties_and_beats_none() -> None:
    lines = verdict_lines(_grid({"pd": [(100, 10), (100, 10)], "local": [(50, 10), (60, 10)],
                                 "ppd": [(50, 10), (60, 10)]}))
    assert lines[0].startswith("verdict: the best fixed route per cell against P->D")
    # best fixed = local in both cells: TTFT -50% and -40% (median -45%), TPOT unchanged
    assert "turn-2+ TTFT -45.0% median (-50.0% to -40.0%)" in lines[0]
    assert "TPOT +0.0% median" in lines[0] and "P->D itself was best in 0 of 2" in lines[0]
    assert lines[1] == ("verdict: ppd (w_tpot 1) tied the best fixed policy in 2 of 2 cells "
                        "and beat it in none")


def test_a_policy_that_beats_every_fixed_one_says_where_and_by_how_much() -> None:
    # live mixes: local's TTFT without its TPOT cost in the second cell (score +0.2 over local)
    lines = verdict_lines(_grid({"pd": [(100, 10), (100, 10)], "local": [(50, 10), (50, 12)],
                                 "live-wtpot3": [(50, 10), (50, 10)]}))
    assert lines[1].startswith("verdict: live-wtpot3 (w_tpot 3) beat every fixed policy in 1 "
                               "of 2 cells (score +0.50 median, up to +0.50)")
    assert "tied the best in 1" in lines[1] and "trailed it in 0" in lines[1]


def test_a_grid_without_pd_or_adaptive_policies_says_what_is_missing() -> None:
    assert "no P->D (pd) runs" in verdict_lines(_grid({"local": [(1, 1), (1, 1)]}))[0]
    lines = verdict_lines(_grid({"pd": [(100, 10), (100, 10)], "local": [(50, 10), (60, 10)]}))
    assert "no ppd or live runs" in lines[-1]

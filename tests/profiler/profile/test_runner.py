"""The profiler's pure parts: grid validation, run order, turn-2 statistics, rows, resuming."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from profiler.profile.runner import (
    ProfileGrid,
    RouteStats,
    cell_row,
    grid_from_mapping,
    run_order,
    turn2_stats,
)
from profiler.replay.client import RequestRecord
from proxy.discretize import Cell, ContextClass
from proxy.route import RouteKind


def _record(turn: int, *, ttft: float | None, tpot: float | None, success: bool = True,
            route: str | None = "local") -> RequestRecord:
    return RequestRecord(
        conversation_id="c", turn=turn, route=route, decode="http://d", prefill=None,
        start_s=0.0, ttft_s=ttft, tpot_s=tpot, e2e_s=1.0, itl_s=(), n_input_tokens=10,
        n_output_tokens=5 if success else 0, success=success,
        error=None if success else "timeout", status=200 if success else None,
    )


def test_grid_rejects_unknown_names_and_keys() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        ProfileGrid(workloads=("tiny", "enormous"))
    with pytest.raises(ValueError, match="no turn-1 profile"):
        ProfileGrid(contexts=(ContextClass.HUGE,))
    with pytest.raises(ValueError, match="unknown grid key"):
        grid_from_mapping({"qps": [1], "durations": 3})
    with pytest.raises(ValueError, match="unknown context class"):
        grid_from_mapping({"contexts": ["medium"]})
    with pytest.raises(ValueError, match="qps"):
        ProfileGrid(qps=(0.0,))


def test_grid_from_mapping_builds_all_cells() -> None:
    grid = grid_from_mapping({"contexts": ["small"], "workloads": ["tiny", "big_paste"],
                              "qps": [0.5, 2], "duration_s": 5})
    assert grid.cells() == [
        Cell(ContextClass.SMALL, "tiny", 0.5), Cell(ContextClass.SMALL, "tiny", 2.0),
        Cell(ContextClass.SMALL, "big_paste", 0.5), Cell(ContextClass.SMALL, "big_paste", 2.0),
    ]


def test_run_order_is_seeded_and_covers_every_cell_and_route() -> None:
    cells = ProfileGrid(workloads=("tiny", "mid_bal", "big_paste"), qps=(0.5, 1, 2)).cells()
    first, again, other = run_order(cells, 7), run_order(cells, 7), run_order(cells, 8)
    assert first == again
    assert first != other
    assert sorted(cell for cell, _ in first) == sorted(cells)
    assert all(sorted(routes) == sorted((RouteKind.PD, RouteKind.LOCAL)) for _, routes in first)
    # Shuffled: both route orders occur, so neither route always runs on a fresher cache.
    assert {routes for _, routes in first} == {(RouteKind.PD, RouteKind.LOCAL),
                                               (RouteKind.LOCAL, RouteKind.PD)}


def test_turn2_stats_ignore_turn1_and_count_failures() -> None:
    records = [
        _record(1, ttft=5.0, tpot=0.5, route="pd"),  # turn 1 builds context: not measured
        _record(2, ttft=0.100, tpot=0.010),
        _record(2, ttft=0.300, tpot=0.030),
        _record(2, ttft=None, tpot=None, success=False),
        _record(2, ttft=9.0, tpot=0.9, route="pd"),  # rerouted (failover): not local's latency
    ]
    stats = turn2_stats(records, RouteKind.LOCAL)
    assert stats.n_requests == 4
    assert stats.success == pytest.approx(3 / 4)
    assert stats.ttft_ms == pytest.approx(200.0)
    assert stats.tpot_ms == pytest.approx(20.0)
    assert 200.0 < stats.ttft_p99_ms <= 300.0


def test_turn2_stats_of_an_all_failed_route_has_no_latency() -> None:
    stats = turn2_stats([_record(2, ttft=None, tpot=None, success=False)], RouteKind.PD)
    assert stats.success == 0.0
    assert math.isnan(stats.ttft_ms) and math.isnan(stats.tpot_ms)


def test_cell_row_has_the_design_columns() -> None:
    pd_stats = RouteStats(400, 50, 800, 90, 1.0, 12)
    local_stats = RouteStats(100, 52, 200, 95, 0.9, 10)
    row = cell_row(Cell(ContextClass.LARGE, "tiny", 1.0), pd_stats, local_stats)
    assert row["context_class"] == "large"
    assert (row["pd_ttft_ms"], row["local_ttft_ms"], row["local_success"]) == (400, 100, 0.9)
    assert row["n_requests"] == 10
    assert (row["pd_n_requests"], row["local_tpot_p99_ms"]) == (12, 95)


def test_cli_rejects_a_non_csv_output(tmp_path: Path) -> None:
    from profiler.profile.cli import main

    with pytest.raises(ValueError, match="NAME.csv"):
        main(["--target", "http://127.0.0.1:9", "--out", str(tmp_path / "t.parquet"),
              "--workloads", "tiny", "--request-rate", "1"])

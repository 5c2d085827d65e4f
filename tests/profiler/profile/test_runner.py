"""The profiler's pure parts: grid validation, run order, turn-2 statistics, rows, resuming."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import pytest

from profiler.profile.runner import (
    ProfileGrid,
    Profiler,
    ReplayPurpose,
    RouteStats,
    cell_row,
    conversation_seed,
    grid_from_mapping,
    run_order,
    turn2_stats,
)
from profiler.replay.client import ReplayResult
from profiler.traces.request_records import RequestRecord
from proxy.shared.discretize import Cell, ContextClass, Shape
from proxy.shared.vocabulary import RouteKind


def _record(turn: int, *, ttft: float | None, tpot: float | None, success: bool = True,
            route: str | None = "local") -> RequestRecord:
    return RequestRecord(
        conversation_id="c", turn=turn, route=route, decode="http://d", prefill=None,
        start_s=0.0, ttft_s=ttft, tpot_s=tpot, e2e_s=1.0, itl_s=(), n_input_tokens=10,
        n_output_tokens=5 if success else 0, success=success,
        error=None if success else "timeout", status=200 if success else None,
    )


def test_grid_defaults_to_the_paper_contexts_and_huge_is_opt_in() -> None:
    assert ProfileGrid().contexts == (ContextClass.SMALL, ContextClass.LARGE)
    grid = grid_from_mapping({"contexts": ["small", "large", "huge"], "qps": [1]})
    assert len(grid.cells()) == 3 * 9
    assert {cell.context_class for cell in grid.cells()} == set(ContextClass)


def test_grid_rejects_unknown_names_and_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        ProfileGrid(workloads=("tiny", "enormous"))
    # Every class has a turn-1 profile now; the check still guards a class added without one.
    monkeypatch.setattr("profiler.profile.grid.TURN1_PROFILES",
                        {ContextClass.SMALL: Shape(128, 128)})
    with pytest.raises(ValueError, match="no turn-1 profile"):
        ProfileGrid(contexts=(ContextClass.LARGE,))
    monkeypatch.undo()
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
    row = cell_row(Cell(ContextClass.LARGE, "tiny", 1.0),
                   {RouteKind.PD: pd_stats, RouteKind.LOCAL: local_stats})
    assert row["context_class"] == "large"
    assert (row["pd_ttft_ms"], row["local_ttft_ms"], row["local_success"]) == (400, 100, 0.9)
    assert row["n_requests"] == 10
    assert (row["pd_n_requests"], row["local_tpot_p99_ms"]) == (12, 95)
    assert not any(column.startswith("readback") for column in row)
    readback = RouteStats(300, 50, 600, 91, 1.0, 8)
    three = cell_row(Cell(ContextClass.LARGE, "tiny", 1.0), {
        RouteKind.PD: pd_stats, RouteKind.LOCAL: local_stats, RouteKind.READBACK: readback})
    assert (three["readback_ttft_ms"], three["readback_n_requests"], three["n_requests"]) == (
        300, 8, 8)


def test_cli_rejects_a_non_csv_output(tmp_path: Path) -> None:
    from profiler.profile.cli import main

    with pytest.raises(ValueError, match="NAME.csv"):
        main(["--target", "http://127.0.0.1:9", "--out", str(tmp_path / "t.parquet"),
              "--workloads", "tiny", "--request-rate", "1"])


class _Interrupted(Exception):
    """Stands for Ctrl-C after the first cell."""


async def _drawn(monkeypatch: pytest.MonkeyPatch, out: Path, grid: ProfileGrid, *,
                 stop_after_first: bool = False) -> dict[tuple[str, float, str], list[str]]:
    """The turn-1 texts a profile run draws per (workload, qps, route); nothing is sent."""
    import profiler.profile.runner as runner

    drawn: dict[tuple[str, float, str], list[str]] = {}

    async def fake_replay(conversations: Any, config: Any, **kwargs: Any) -> ReplayResult:
        # Synthetic ids are syn-{turn 1}-{workload}-{turns}-s{seed}-{index}.
        workload = conversations[0].id.rsplit("-s", 1)[0].split("-")[2]
        key = (workload, config.qps, config.headers_for_turn(2)["x-ppd-route"])
        drawn.setdefault(key, []).extend(c.turns[0].user for c in conversations)
        return ReplayResult(records=[], wall_time_s=0.0, config=config)

    def on_cell(cell: Cell, row: dict[str, Any]) -> None:
        if stop_after_first:
            raise _Interrupted

    monkeypatch.setattr(runner, "replay", fake_replay)
    profiler = Profiler(grid=grid, target="http://proxy", out_csv=out, meta={}, seed=5,
                        progress=False, on_cell=on_cell)
    with contextlib.suppress(_Interrupted):
        await profiler.run()
    return drawn


async def test_a_resumed_run_draws_the_same_conversations_as_a_fresh_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    grid = ProfileGrid(contexts=(ContextClass.SMALL,), workloads=("tiny", "mid_bal"),
                       qps=(1.0, 2.0), duration_s=2.0, warmup_conversations=1)
    fresh = await _drawn(monkeypatch, tmp_path / "fresh.csv", grid)
    first = await _drawn(monkeypatch, tmp_path / "resumed.csv", grid, stop_after_first=True)
    resumed = await _drawn(monkeypatch, tmp_path / "resumed.csv", grid)
    assert len(fresh) == 2 * len(grid.cells()) and len(first) == 2
    assert not set(first) & set(resumed)  # the resumed run skipped the cell already measured
    assert resumed == {key: fresh[key] for key in resumed}
    # Every (cell, route) replay has conversations of its own.
    openings = [text for texts in fresh.values() for text in texts]
    assert len(set(openings)) == len(openings)


def test_conversation_seeds_depend_on_what_they_are_for_only() -> None:
    cell = Cell(ContextClass.SMALL, "tiny", 1.0)
    seeds = {conversation_seed(0, c, r, p) for c in (cell, cell._replace(qps=2.0))
             for r in RouteKind for p in ReplayPurpose}
    assert len(seeds) == 2 * len(RouteKind) * len(ReplayPurpose)
    assert conversation_seed(0, cell, RouteKind.PD, ReplayPurpose.MEASURE) == conversation_seed(
        0, Cell(ContextClass("small"), "tiny", 1), RouteKind("pd"), ReplayPurpose("measure"))


async def test_a_table_of_another_token_definition_is_not_resumed(tmp_path: Path) -> None:
    grid = ProfileGrid(contexts=(ContextClass.SMALL,), workloads=("tiny",), qps=(1.0,))
    out = tmp_path / "t.csv"
    out.write_text("context_class,workload,qps\n")
    (tmp_path / "t.meta.json").write_text('{"token_definition": "template-v0"}')
    profiler = Profiler(grid=grid, target="http://proxy", out_csv=out, meta={}, progress=False)
    with pytest.raises(ValueError, match="token definition 'template-v0'"):
        await profiler.run()

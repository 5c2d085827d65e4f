"""`ppd table show|plot` print and draw what the proxy's own decision code decides."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.cli import main as ppd
from profiler.tables.io import write_table


def _row(workload: str, qps: float, pd_ttft: float, local_ttft: float,
         local_tpot: float) -> dict:
    return {"context_class": "small", "workload": workload, "qps": qps,
            "pd_ttft_ms": pd_ttft, "pd_tpot_ms": 50.0, "pd_success": 1.0,
            "local_ttft_ms": local_ttft, "local_tpot_ms": local_tpot, "local_success": 1.0,
            "n_requests": 10}


@pytest.fixture
def table(tmp_path: Path) -> Path:
    # tiny: TTFT -50%, TPOT +20%: local at equal weights, pd when TPOT weighs 3x.
    rows = [_row("tiny", 1.0, 200.0, 100.0, 60.0), _row("big_paste", 1.0, 100.0, 300.0, 50.0)]
    path, _, _ = write_table(rows, tmp_path / "t.csv", {"model": "tiny"})
    return path


def test_show_prints_the_decision_for_the_weights(table: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert ppd(["table", "show", str(table)]) == 0
    equal = capsys.readouterr().out
    assert "local (+0.30)" in equal  # 1*0.5 - 1*0.2
    assert "pd (-2.00)" in equal
    assert "local in 1/2 cells" in equal

    assert ppd(["table", "show", str(table), "--w-tpot", "3"]) == 0
    tpot_heavy = capsys.readouterr().out
    assert "pd (-0.10)" in tpot_heavy  # 0.5 - 3*0.2
    assert "local in 0/2 cells" in tpot_heavy


def test_plot_writes_one_png_per_context_class(table: Path, tmp_path: Path) -> None:
    out = tmp_path / "plots"
    assert ppd(["table", "plot", str(table), "--out", str(out)]) == 0
    png = out / "t.small.png"
    assert png.read_bytes().startswith(b"\x89PNG")


def test_show_reports_a_missing_table_clearly(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert ppd(["table", "show", str(tmp_path / "none.csv")]) == 1
    assert "not found" in capsys.readouterr().err


def test_heatmap_cells_carry_the_verdict_as_text(table: Path) -> None:
    from profiler.tables.cli import decision_frame, heatmap_grids

    grids = heatmap_grids(decision_frame(table, w_ttft=1.0, w_tpot=1.0))
    scores, texts = grids["small"]
    assert list(texts.index) == ["tiny", "big_paste"]  # the paper's order
    assert texts.loc["tiny", 1.0] == "local\n+0.30"
    assert texts.loc["big_paste", 1.0] == "pd\n-2.00"
    assert scores.loc["tiny", 1.0] == pytest.approx(0.3)


def test_plot_defaults_beside_a_run_but_not_into_the_repo_tables(
        table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from profiler.tables.cli import default_plot_dir

    monkeypatch.chdir(tmp_path)
    assert ppd(["table", "plot", str(table)]) == 0
    assert (table.parent / "t.small.png").is_file()
    repo_tables = Path(__file__).resolve().parents[3] / "tables" / "tiny-cpu-1p1d.csv"
    assert default_plot_dir(repo_tables) == Path("runs") / "tables"


def test_an_unmeasured_route_is_labelled_so(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    failed = {**_row("tiny", 1.0, 200.0, float("nan"), float("nan")), "local_success": 0.0}
    path, _, _ = write_table([failed], tmp_path / "t.csv", {})
    assert ppd(["table", "show", str(path)]) == 0
    assert "pd (unmeasured)" in capsys.readouterr().out


def test_show_says_where_a_readback_table_reads_back(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # tiny: local -0.10 at w_tpot 3, readback (150 ms, TPOT as pd's) +0.25.
    row = {**_row("tiny", 1.0, 200.0, 100.0, 60.0), "readback_ttft_ms": 150.0,
           "readback_tpot_ms": 50.0, "readback_success": 1.0}
    path, _, _ = write_table([row], tmp_path / "t.csv", {})
    assert ppd(["table", "show", str(path), "--w-tpot", "3"]) == 0
    shown = capsys.readouterr().out
    assert "readback (+0.25) | pd" in shown
    assert "'A (score) | B'" in shown

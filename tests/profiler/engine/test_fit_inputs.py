"""`ppd sim fit` refuses a bad requests file with one line naming the file and the column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.cli import main as ppd
from tests.profiler.engine.test_fit_cli import replay_rows


def fit_run(tmp_path: Path, rows: pd.DataFrame, capsys: pytest.CaptureFixture[str]
            ) -> tuple[int, str]:
    """(rc, stderr) of `ppd sim fit` on a run holding rows; the preset must not be written
    when it fails."""
    run = tmp_path / "run"
    run.mkdir()
    rows.to_csv(run / "requests.csv", index=False)
    out = tmp_path / "fit.json"
    rc = ppd(["sim", "fit", str(run), "--out", str(out)])
    assert out.exists() == (rc == 0)
    return rc, capsys.readouterr().err


def test_a_missing_column_is_named_as_replay_writes_it(tmp_path, capsys):
    rc, err = fit_run(tmp_path, replay_rows().drop(columns=["ttft_ms"]), capsys)
    assert rc == 1
    assert "requests.csv: not a replay requests file (missing column(s) ['ttft_ms'])" in err
    assert "ttft_s" not in err  # the internal name the file never had


def test_text_in_a_latency_column_is_refused(tmp_path, capsys):
    rows = replay_rows().astype({"ttft_ms": object})
    rows.loc[[3, 7], "ttft_ms"] = "fast"
    rc, err = fit_run(tmp_path, rows, capsys)
    assert rc == 1
    assert "requests.csv: column ttft_ms: 2 row(s) not a number (first: 'fast')" in err


def test_an_infinite_latency_is_refused_not_fitted_to_nan(tmp_path, capsys):
    rows = replay_rows()
    rows.loc[[1, 2, 5], "tpot_ms"] = np.inf
    rc, err = fit_run(tmp_path, rows, capsys)
    assert rc == 1
    assert "column tpot_ms: 3 row(s) infinite" in err


def test_a_negative_latency_is_refused_not_clamped(tmp_path, capsys):
    rows = replay_rows()
    rows["e2e_ms"] = -rows["e2e_ms"]
    rc, err = fit_run(tmp_path, rows, capsys)
    assert rc == 1
    assert f"column e2e_ms: {len(rows)} row(s) negative" in err


def test_an_empty_requests_file_is_named(tmp_path, capsys):
    rc, err = fit_run(tmp_path, pd.DataFrame(), capsys)
    assert rc == 1
    assert "requests.csv: the file is empty" in err


def test_failed_requests_without_latencies_still_fit(tmp_path, capsys):
    # an empty cell is a request that got no first token, not a bad file
    rows = replay_rows()
    rows.loc[[0, 4], ["ttft_ms", "tpot_ms"]] = np.nan
    rows.loc[[0, 4], "success"] = False
    rc, err = fit_run(tmp_path, rows, capsys)
    assert (rc, err) == (0, "")

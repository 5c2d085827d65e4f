"""`ppd sim calibrate` refuses a bad probe or /metrics file before fitting, with one line
naming the file and what is wrong in it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from profiler.cli import main as ppd
from profiler.engine.calibrate import read_run
from tests.profiler.engine.test_fit_cli import replay_rows


def probe_frame() -> pd.DataFrame:
    """A few rows of what `ppd cluster probe` writes to probe.csv."""
    rows = [{"node": "http://p0", "kind": kind, "prompt_tokens": n, "computed_tokens": n,
             "prefill_ms": 5.0 + 0.01 * n, "queue_ms": 0.1, "client_ms": 9.0 + 0.01 * n}
            for n in (128, 512, 1024) for kind in ("cold", "text")]
    return pd.DataFrame(rows)


def calibrate_with_probe(tmp_path: Path, probe: pd.DataFrame | None,
                         capsys: pytest.CaptureFixture[str]) -> str:
    """stderr of a calibrate that must fail with rc 1. The runs do not exist: the probe is
    checked before any run is read."""
    path = tmp_path / "probe.csv"
    if probe is None:
        path.write_text("")
    else:
        probe.to_csv(path, index=False)
    runs = [str(tmp_path / "no-run-a"), str(tmp_path / "no-run-b")]
    assert ppd(["sim", "calibrate", *runs, "--probe", str(path),
                "--out", str(tmp_path / "x.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ppd sim: error: {path}: ") and err.count("\n") == 1
    return err


@pytest.mark.parametrize("column", ["kind", "client_ms"])
def test_a_probe_missing_a_column_is_named(tmp_path, capsys, column):
    err = calibrate_with_probe(tmp_path, probe_frame().drop(columns=[column]), capsys)
    assert f"not a shape probe from `ppd cluster probe` (missing column(s) ['{column}'])" in err


def test_an_empty_probe_is_named(tmp_path, capsys):
    assert "the file is empty" in calibrate_with_probe(tmp_path, None, capsys)


def test_text_in_a_probe_timing_is_refused(tmp_path, capsys):
    probe = probe_frame().astype({"queue_ms": object})
    probe.loc[2, "queue_ms"] = "slow"
    err = calibrate_with_probe(tmp_path, probe, capsys)
    assert "column queue_ms: 1 row(s) not a number (first: 'slow')" in err


def test_an_empty_probe_cell_is_refused_before_the_solver_sees_it(tmp_path, capsys):
    probe = probe_frame()
    probe.loc[[0, 3], "prefill_ms"] = float("nan")
    err = calibrate_with_probe(tmp_path, probe, capsys)
    assert "column prefill_ms: 2 row(s) empty (or NaN)" in err


def test_an_unknown_probe_kind_is_refused(tmp_path, capsys):
    probe = probe_frame()
    probe.loc[1, "kind"] = "warm"
    err = calibrate_with_probe(tmp_path, probe, capsys)
    assert "column kind: unknown kind(s) ['warm']" in err


def test_a_nan_metric_is_named_with_its_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    replay_rows().to_csv(run / "requests.csv", index=False)
    (run / "metrics-before-decode-d0.txt").write_text("")
    after = run / "metrics-after-decode-d0.txt"
    after.write_text('vllm:inter_token_latency_seconds_sum{engine="0"} NaN\n'
                     'vllm:inter_token_latency_seconds_count{engine="0"} 12\n')
    with pytest.raises(ValueError, match="metrics-after-decode-d0.txt: metric") as error:
        read_run(run)
    assert "vllm:inter_token_latency_seconds_sum are not finite numbers" in str(error.value)

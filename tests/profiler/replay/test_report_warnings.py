"""`ppd report compare`'s warm-cache warning reads `--reset-prefix-cache` from the runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from profiler.cli import main as ppd
from profiler.replay import ReplayConfig, ReplayResult
from profiler.replay.metrics import summarize
from profiler.replay.output import write_run
from profiler.traces.request_records import RequestRecord


def _run(root: Path, name: str, **extra: Any) -> Path:
    records = [RequestRecord(conversation_id="c0", turn=turn, route="pd", decode="d",
                             prefill=None, start_s=0.0, ttft_s=0.1, tpot_s=0.01, e2e_s=0.2,
                             itl_s=(0.01,), n_input_tokens=5, n_output_tokens=2, success=True,
                             error=None, status=200) for turn in (1, 2)]
    config = ReplayConfig(target="http://127.0.0.1:8000", qps=1.0, duration_s=1.0)
    result = ReplayResult(records=records, wall_time_s=1.0, config=config, n_conversations=1)
    write_run(root / name, result, summarize(records, 1.0), label=f"{name}@1", dataset="syn",
              extra=extra)
    return root / name


def _warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str], *runs: Path) -> str:
    assert ppd(["report", "compare", *map(str, runs), "--out", str(tmp_path / "o")]) == 0
    return capsys.readouterr().err


def test_runs_that_both_reset_the_prefix_cache_get_no_warm_cache_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_run(tmp_path, name, reset_prefix_cache=True) for name in ("pd", "ppd")]
    assert "prefix cache" not in _warnings(tmp_path, capsys, *runs)


def test_a_run_that_did_not_reset_is_named(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_run(tmp_path, "pd", reset_prefix_cache=True),
            _run(tmp_path, "ppd", reset_prefix_cache=False)]
    err = _warnings(tmp_path, capsys, *runs)
    assert "pd@1, ppd@1 replayed the same conversations (syn, --seed 0)" in err
    assert "and ppd@1 did not reset the prefix cache first" in err
    assert "--reset-prefix-cache" in err


def test_runs_written_before_the_flag_was_recorded_still_warn(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_run(tmp_path, "pd"), _run(tmp_path, "ppd")]
    assert "and pd@1, ppd@1 did not reset" in _warnings(tmp_path, capsys, *runs)


def test_simulated_runs_start_cold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_run(tmp_path, name, simulated=True) for name in ("pd", "ppd")]
    assert "prefix cache" not in _warnings(tmp_path, capsys, *runs)

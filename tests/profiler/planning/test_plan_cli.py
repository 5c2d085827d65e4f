"""`ppd sim plan` end to end on small searches, and its usage errors."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from profiler.cli import main as ppd


def test_two_gpus_rank_their_layouts_with_a_table_built_for_ppd(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    assert ppd(["sim", "plan", "--gpus", "2", "--dataset", "synthetic:small-mid_bal",
                "--conversation-rate", "2", "--duration", "4", "--seeds", "2",
                "--processes", "1", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "2 GPUs, h100:llama-3.1-8b -> 2 instances of tp1" in text
    assert "search: 4 candidates to screen" in text  # 1P1D x pd, local, live; 2R replica
    assert "built a ppd table for 1P1D" in text  # no table is shipped for 1P1D
    assert (out / "tables" / "1p1d.csv").is_file()
    ranked = pd.read_csv(out / "ranked.csv")
    assert set(zip(ranked["layout"], ranked["policy"], strict=True)) == {
        ("1P1D", "pd"), ("1P1D", "local"), ("1P1D", "live"), ("1P1D", "ppd"), ("2R", "replica")}
    assert ranked["slo_attainment"].between(0, 1).all()
    first = ranked.iloc[0]
    assert f"recommendation: {first['layout']} with policy {first['policy']}" in text
    assert "over the runner-up" in text
    assert (out / "plan.png").stat().st_size > 0
    rows = pd.read_csv(out / "plan.csv")
    assert rows["seed"].nunique() == 2
    # 8 conversations a run: far too few to rank, and said so
    assert "too small a sample to rank" in captured.err


def test_a_tp4_model_on_eight_gpus_ranks_the_two_instance_layouts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    assert ppd(["sim", "plan", "--gpus", "8", "--cost", "h100:llama-3.1-70b:tp4",
                "--dataset", "synthetic:small-tiny", "--conversation-rate", "1",
                "--duration", "3", "--seeds", "1", "--policies", "pd,local",
                "--processes", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "-> 2 instances of tp4" in text
    ranked = pd.read_csv(out / "ranked.csv")
    assert set(ranked["layout"]) == {"1P1D", "2R"}


@pytest.mark.parametrize(("argv", "message"), [
    (["--gpus", "65"], "--gpus must be between 1 and 64"),
    (["--gpus", "8", "--policies", ","], "--policies names nothing"),
    (["--gpus", "8", "--slo-tpot", "0"], "TPOT bound must be a finite number > 0"),
    (["--gpus", "8", "--conversation-rate", "-1"], "--conversation-rate must be a finite number"),
])
def test_usage_errors_are_clear(argv: list[str], message: str, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    rate = [] if "--conversation-rate" in argv else ["--conversation-rate", "1"]
    assert ppd(["sim", "plan", *argv, "--dataset", "synthetic:small-tiny", *rate,
                "--out", str(tmp_path / "o")]) != 0
    assert message in capsys.readouterr().err


def test_a_timed_trace_is_planned_at_a_time_scale(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    assert ppd(["sim", "plan", "--gpus", "2", "--dataset", "datasets/samples/mooncake_sample.jsonl",
                "--time-scale", "1", "--duration", "10", "--seeds", "1", "--policies",
                "pd,local", "--processes", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "at time-scale 1" in text
    assert set(pd.read_csv(out / "ranked.csv")["layout"]) == {"1P1D", "2R"}


def test_a_conversation_rate_on_a_timed_trace_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ppd(["sim", "plan", "--gpus", "2", "--dataset", "datasets/samples/mooncake_sample.jsonl",
                "--conversation-rate", "1", "--out", str(tmp_path / "o")]) != 0
    assert "its load is --time-scale F" in capsys.readouterr().err

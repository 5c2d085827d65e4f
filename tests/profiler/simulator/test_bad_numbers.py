"""Numbers a user types into the offline tools: NaN, infinity, zero and negatives are refused
in words before anything runs (a NaN link used to hang `ppd sim run`; a NaN rate ended in
"cannot convert float NaN to integer"; `--processes -2` and NaN weights ran on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.cli import main as ppd


def _exit_code(args: list[str]) -> int:
    """ppd's exit code: 1 from its error boundary, 2 from argparse's usage error."""
    try:
        return ppd(args)
    except SystemExit as exit_:
        return int(exit_.code or 0)


RUN = ["sim", "run", "--layout", "1P1D", "--dataset", "synthetic:small-tiny",
       "--conversation-rate", "1", "--duration", "2"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("extra", "message"), [
    (["--link", "nan:nan"], "unknown link 'nan:nan'"),
    (["--link", "1:inf"], "unknown link '1:inf'"),
    (["--conversation-rate", "nan"], "conversation rate (nan): must be a finite number > 0"),
    (["--duration", "inf"], "duration (inf): must be a finite number > 0"),
    (["--timeout", "nan"], "timeout (nan): must be a finite number > 0"),
    (["--load-window", "nan"], "load window (nan): must be a finite number > 0"),
    (["--max-turns", "0"], "argument --max-turns: must be at least 1 (got 0)"),
])
def test_sim_run_refuses_a_number_it_cannot_run(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                extra: list[str], message: str) -> None:
    code = _exit_code([*RUN, "--out", str(tmp_path / "run"), *extra])
    assert code in (1, 2)  # 2: argparse's own usage error
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["sim", "grid", "--layouts", "1P1D", "--datasets", "synthetic:small-tiny", "--qps", "nan",
      "--policies", "pd"], "conversation rate (nan)"),
    (["sim", "grid", "--layouts", "1P1D", "--datasets", "synthetic:small-tiny", "--qps", "1",
      "--policies", "pd", "--processes", "-2"], "argument --processes: must be at least 1"),
    (["profile", "--backend", "sim", "--layout", "1P1D", "--contexts", "small",
      "--workloads", "tiny", "--request-rate", "1", "--w-ttft", "nan"],
     "argument --w-ttft: must be a finite number >= 0 (got nan)"),
    (["profile", "--backend", "sim", "--layout", "1P1D", "--contexts", "small",
      "--workloads", "tiny", "--request-rate", "1", "--processes", "0"],
     "argument --processes: must be at least 1 (got 0)"),
])
def test_grid_and_profile_refuse_bad_numbers(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             args: list[str], message: str) -> None:
    assert _exit_code([*args, "--out", str(tmp_path / "out.parquet")]) in (1, 2)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("weight", ["nan", "inf", "-1", "abc"])
def test_table_show_refuses_a_weight_the_proxy_would(capsys: pytest.CaptureFixture[str],
                                                     weight: str) -> None:
    table = Path(__file__).resolve().parents[3] / "tables" / "tiny-cpu-1p1d.csv"
    assert _exit_code(["table", "show", str(table), "--w-ttft", weight]) == 2
    assert "argument --w-ttft:" in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["sim", "grid", "--layouts", "1P1D", "--datasets", "synthetic:small-tiny", "--qps", "1",
     "--policies", "pd"],
    ["profile", "--backend", "sim", "--layout", "1P1D", "--contexts", "small",
     "--workloads", "tiny", "--request-rate", "1"],
])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    assert _exit_code([*command, "--out", str(tmp_path)]) == 2
    assert "is a folder; give a file name in it" in capsys.readouterr().err
    a_file = tmp_path / "table.csv"
    a_file.write_text("x\n")
    assert _exit_code([*command, "--out", str(a_file / "under-a-file.parquet")]) == 2
    assert "is not a writable folder" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [("--qps", ""), ("--layouts", ","),
                                             ("--datasets", " , "), ("--policies", "")])
def test_an_empty_grid_axis_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     flag: str, value: str) -> None:
    axes = {"--layouts": "1P1D", "--datasets": "synthetic:small-tiny", "--qps": "1",
            "--policies": "pd", flag: value}
    args = [part for name, given in axes.items() for part in (name, given)]
    assert _exit_code(["sim", "grid", *args, "--out", str(tmp_path / "g.parquet")]) == 1
    assert f"{flag} names nothing" in capsys.readouterr().err


def test_the_grid_table_is_parquet_or_csv(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sim", "grid", "--layouts", "1P1D", "--datasets", "synthetic:small-tiny", "--qps",
            "1", "--policies", "pd", "--out", str(tmp_path / "g.txt")]
    assert _exit_code(args) == 1
    assert "the table is written as .parquet or .csv" in capsys.readouterr().err
    assert not (tmp_path / "g.txt").exists()


@pytest.mark.parametrize(("command", "new"), [
    (RUN, "--conversation-rate"),
    (["sim", "grid", "--layouts", "1P1D", "--datasets", "synthetic:small-tiny",
      "--policies", "pd", "--conversation-rates", "2"], "--conversation-rates"),
])
def test_a_rate_and_its_old_alias_together_are_refused(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       command: list[str], new: str) -> None:
    # argparse keeps the last of the two silently: `--conversation-rate 2 --qps 1` ran at 1
    assert _exit_code([*command, "--qps=1", "--out", str(tmp_path / "g.parquet")]) == 1
    assert f"{new} and --qps are one option" in capsys.readouterr().err

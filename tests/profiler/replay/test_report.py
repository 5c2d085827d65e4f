"""`ppd report compare` on run directories written by the replay output code."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from profiler.cli import main as ppd
from profiler.replay import ReplayConfig, ReplayResult, report
from profiler.replay.metrics import summarize
from profiler.replay.output import write_run
from profiler.traces.request_records import RequestRecord


def _run_dir(root: Path, name: str, qps: float, ttft_s: float, route: str,
             dataset: str = "syn", backend: str | None = None) -> Path:
    records = [
        RequestRecord(conversation_id=f"c{i}", turn=turn, route="pd" if turn == 1 else route,
                      decode="d", prefill=None, start_s=float(i), ttft_s=ttft_s * turn,
                      tpot_s=0.01, e2e_s=ttft_s * turn + 0.1, itl_s=(0.01,) * 10,
                      n_input_tokens=50, n_output_tokens=11, success=True, error=None,
                      status=200)
        for i in range(4) for turn in (1, 2)
    ]
    config = ReplayConfig(target="http://127.0.0.1:8000", qps=qps, duration_s=4.0)
    result = ReplayResult(records=records, wall_time_s=4.0, config=config, n_conversations=4)
    out = root / name
    write_run(out, result, summarize(records, 4.0), label=f"{route}@{qps:g}", dataset=dataset,
              backend=backend)
    return out


def test_compare_table_csv_and_plots(tmp_path: Path) -> None:
    runs = [
        _run_dir(tmp_path, "pd-1", 1.0, 0.20, "pd"),
        _run_dir(tmp_path, "pd-2", 2.0, 0.40, "pd"),
        _run_dir(tmp_path, "local-1", 1.0, 0.10, "local"),
    ]
    out = tmp_path / "cmp"
    table, written = report.compare(runs, out)
    lines = table.splitlines()
    assert lines[0].split() == ["pd@1", "pd@2", "change", "local@1", "change"]
    row = next(line for line in lines if line.startswith("turn-2+ TTFT mean ms"))
    assert row.split()[-5:] == ["400.0", "800.0", "+100.0%", "200.0", "-50.0%"]
    share = next(line for line in lines if line.startswith("local share"))
    assert share.split()[-5:] == ["0.000", "0.000", "-", "1.000", "-"]  # no change against 0
    frame = pd.read_csv(out / "compare.csv")
    assert list(frame["series"]) == ["pd", "pd", "local"]
    assert list(frame["conversation_rate"]) == [1.0, 2.0, 1.0]
    for name in ("latency_vs_load.png", "p99_ttft_vs_throughput.png"):
        assert (out / name) in written
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def test_runs_on_emulated_nodes_say_so_in_the_csv(tmp_path: Path) -> None:
    emulated = "emulated (h100:llama-3.1-8b; ppd emulated nodes, not vLLM)"
    runs = [_run_dir(tmp_path, "real", 1.0, 0.2, "pd"),
            _run_dir(tmp_path, "emu", 1.0, 0.1, "local", backend=emulated)]
    report.compare(runs, tmp_path / "cmp")
    frame = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert list(frame["backend"]) == ["vllm", emulated]
    assert report.load_run(runs[1]).backend == emulated


def test_single_run_has_no_load_plots_and_labels_are_made_unique(tmp_path: Path) -> None:
    one = _run_dir(tmp_path, "a", 1.0, 0.2, "pd")
    _, written = report.compare([one], tmp_path / "cmp1")
    assert [path.name for path in written] == ["compare.csv", "compare.html"]
    twin = _run_dir(tmp_path, "b", 1.0, 0.2, "pd")
    runs = [report.load_run(one), report.load_run(twin)]
    assert report.column_names(runs) == ["pd@1 (a)", "pd@1 (b)"]


def test_cli_errors_on_a_directory_without_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ppd(["report", "compare", str(tmp_path), "--out", str(tmp_path / "o")]) == 1
    assert "has no summary.json" in capsys.readouterr().err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "summary.json").write_text('{"label": "x"}')
    assert ppd(["report", "compare", str(broken), "--out", str(tmp_path / "o")]) == 1
    assert "not a ppd replay summary" in capsys.readouterr().err


def _with_summary(run: Path, summary: object) -> Path:
    """The run directory with its summary.json's "summary" replaced."""
    path = run / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "summary": summary}))
    return path


def _compare_error(runs: list[Path], tmp_path: Path,
                   capsys: pytest.CaptureFixture[str]) -> str:
    assert ppd(["report", "compare", *map(str, runs), "--out", str(tmp_path / "o")]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and not (tmp_path / "o").exists()  # checked before any output
    return errors[0]


def test_a_null_summary_is_named_with_its_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = _run_dir(tmp_path, "a", 1.0, 0.2, "pd"), _run_dir(tmp_path, "b", 2.0, 0.2, "pd")
    path = _with_summary(bad, None)
    error = _compare_error([good, bad], tmp_path, capsys)
    assert f'{path}: its "summary" is null, not the run\'s metrics' in error


def test_text_where_a_summary_has_a_number_is_named_with_its_file_and_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = _run_dir(tmp_path, "a", 1.0, 0.2, "pd"), _run_dir(tmp_path, "b", 2.0, 0.2, "pd")
    summary = json.loads((bad / "summary.json").read_text())["summary"]
    path = _with_summary(bad, {**summary, "tpot_ms_mean": "abc", "output_tok_s": True})
    error = _compare_error([good, bad], tmp_path, capsys)
    assert (f'{path}: in its summary, "tpot_ms_mean" is "abc"; "output_tok_s" is true: '
            "a number (or null) was expected") in error


def test_cli_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_run_dir(tmp_path, f"r{q}", q, 0.1 * q, "local") for q in (1.0, 3.0)]
    assert ppd(["report", "compare", *map(str, runs), "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    assert "local@1" in printed and "local@3" in printed and "latency_vs_load.png" in printed


def test_runs_of_different_datasets_are_compared_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_run_dir(tmp_path, "a", 1.0, 0.1, "pd", dataset="sharegpt"),
            _run_dir(tmp_path, "b", 1.0, 0.1, "local", dataset="synthetic:mixed")]
    assert ppd(["report", "compare", *map(str, runs), "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "warning: the runs replayed different datasets" in err
    assert "sharegpt" in err and "synthetic:mixed" in err
    assert "targets" not in err  # same target: nothing to say


def test_one_load_point_gets_an_axis_from_zero(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots()
    axis.plot([0.5], [100.0], marker="o")
    report._sane_limits(axis, [0.5, 0.5])
    assert axis.get_xlim() == (0.0, 0.625)
    assert axis.get_ylim() == pytest.approx((0.0, 115.0))  # the point is not on the edge
    plt.close(figure)


@pytest.mark.parametrize(("name", "frame", "what"), [
    ("grid.parquet", pd.DataFrame({"layout": ["1P3D"], "dataset": ["small-tiny"], "qps": [1.0],
                                   "policy": ["pd"]}), "a simulator grid (`ppd sim grid`"),
    ("table.csv", None, "a decision table (`ppd profile`"),
])
def test_a_table_given_for_a_run_says_what_it_is_and_what_to_pass(
        name: str, frame: pd.DataFrame | None, what: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / name
    if frame is None:
        from profiler.tables.io import TABLE_COLUMNS

        frame = pd.DataFrame([{column: 1 for column in TABLE_COLUMNS}])
    if path.suffix == ".parquet":
        frame.to_parquet(path)
    else:
        frame.to_csv(path, index=False)
    assert ppd(["report", "compare", str(path), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert what in err and "ppd replay --out DIR" in err


def test_runs_of_the_same_conversations_are_compared_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_run_dir(tmp_path, "a", 1.0, 0.1, "pd"), _run_dir(tmp_path, "b", 1.0, 0.1, "local")]
    assert ppd(["report", "compare", *map(str, runs), "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "pd@1, local@1 replayed the same conversations (syn, --seed 0)" in err
    assert "different --seed values" in err

"""benchmarks/cpu_validation.py on runs the simulator made: a run predicts itself, and the same
runs made on emulated nodes print beside with their error against the real ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks.cpu_validation import main
from profiler.replay.metrics import summarize
from profiler.simulator.replay_twin import simulate_twin
from proxy.shared.vocabulary import RouteKind
from tests.profiler.engine.test_calibrate import make_run

TRUTH = "test-calibrate-truth"  # the preset test_calibrate registers and makes its runs with


def replayed(root: Path, route: RouteKind) -> Path:
    """A simulated run with the summary `ppd replay` writes (its own measurement)."""
    run = make_run(root, "synthetic:small-mid_bal", 1.0, route)
    result = simulate_twin(run, TRUTH)
    document = json.loads((run / "summary.json").read_text())
    document["summary"] = summarize(result.records, result.wall_time_s)
    (run / "summary.json").write_text(json.dumps(document))
    return run


def test_emulated_runs_print_beside_the_prediction_with_their_error(tmp_path: Path,
                                                                    capsys) -> None:
    runs = [replayed(tmp_path / "real", route) for route in (RouteKind.LOCAL, RouteKind.PD)]
    for run in runs:  # the "emulated" set: the same runs, turn-2 TTFT 20% slower
        copy = tmp_path / "emulated" / run.name
        shutil.copytree(run, copy)
        document = json.loads((copy / "summary.json").read_text())
        document["summary"]["turn2plus_ttft_ms_p50"] *= 1.2
        (copy / "summary.json").write_text(json.dumps(document))
    assert main([*map(str, runs), "--cost", TRUTH, "--emulated",
                 str(tmp_path / "emulated")]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| small-mid_bal")]
    assert len(rows) == 2 and all("(+0%)" in row for row in rows)  # each predicts itself
    assert all(row.count("vs real)") == 3 and "(+20% vs real)" in row for row in rows)
    assert "T2 TTFT p50: emulated against real, median |error| 20%, 0 of 2 within 15%" in out
    assert "T2 TPOT mean: emulated against real, median |error| 0%, 2 of 2 within 15%" in out

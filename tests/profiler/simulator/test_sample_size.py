"""`ppd sim run` warns when a run holds fewer than ~100 conversations."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.cli import main as ppd
from profiler.simulator.sample_size import MIN_CONVERSATIONS, small_run_warning


def test_the_warning_says_how_long_a_run_needs() -> None:
    said = small_run_warning(23, 3.0)
    assert said is not None
    assert "holds 23 conversations (fewer than 100)" in said
    assert "--duration 33 at 3 conversations/s" in said
    assert small_run_warning(MIN_CONVERSATIONS, 3.0) is None


def test_a_short_sim_run_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ppd(["sim", "run", "--layout", "1P1D", "--dataset", "synthetic:small-tiny",
                "--conversation-rate", "2", "--duration", "3", "--policy", "pd",
                "--out", str(tmp_path / "run")]) == 0
    assert "ppd sim run: warning: the run holds" in capsys.readouterr().err

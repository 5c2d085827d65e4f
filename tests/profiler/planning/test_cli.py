"""`ppd sim plan` and `ppd sim compare` join `ppd sim` from the layer above the simulator."""

from __future__ import annotations

import pytest

from profiler.cli import main as ppd
from profiler.planning.cli import PLANNING_COMMANDS
from profiler.simulator.cli import SIMULATOR_COMMANDS


def test_ppd_sim_help_lists_the_planning_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ppd(["sim", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name, (one_line, _) in PLANNING_COMMANDS.items():
        assert name in out and one_line in out
    assert not set(PLANNING_COMMANDS) & set(SIMULATOR_COMMANDS)


@pytest.mark.parametrize("name", sorted(PLANNING_COMMANDS))
def test_a_planning_command_runs_through_ppd_sim(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ppd(["sim", name, "--help"])
    assert exit_info.value.code == 0
    assert f"usage: ppd sim {name}" in capsys.readouterr().out

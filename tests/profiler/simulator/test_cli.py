"""`ppd sim`'s one command module: every command listed once, each run by its name."""

from __future__ import annotations

import argparse

import pytest

from profiler.simulator.cli import SIMULATOR_COMMANDS, build_parser, main

ENGINE_COMMANDS = {"presets", "step", "idle", "fit", "calibrate"}


def _parser_commands() -> list[str]:
    [commands] = [action for action in build_parser()._actions
                  if isinstance(action, argparse._SubParsersAction)]
    return list(commands.choices)


def test_the_parser_lists_the_simulators_table_and_the_engine_models_commands_once() -> None:
    listed = _parser_commands()
    assert len(listed) == len(set(listed))
    assert set(listed) == set(SIMULATOR_COMMANDS) | ENGINE_COMMANDS
    assert not set(SIMULATOR_COMMANDS) & ENGINE_COMMANDS


@pytest.mark.parametrize("name", sorted(SIMULATOR_COMMANDS))
def test_a_simulator_command_parses_its_own_flags(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    assert f"usage: ppd sim {name}" in capsys.readouterr().out


def test_the_engine_models_commands_run_through_ppd_sim(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["step", "--preset", "h100:llama-3.1-8b", "--decode", "2",
                 "--context", "100"]) == 0
    assert "2 decoding at 100 context" in capsys.readouterr().out
    assert main(["idle", "--preset", "h100:llama-3.1-8b", "--prompt", "500"]) == 0
    assert capsys.readouterr().out.startswith("ttft_ms=")
    with pytest.raises(SystemExit) as exit_info:
        main(["step", "--decode", "2"])  # --preset is required: argparse's usage error
    assert exit_info.value.code == 2
    assert "--preset" in capsys.readouterr().err

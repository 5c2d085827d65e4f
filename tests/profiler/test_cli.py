"""The `ppd` dispatcher: every command answers --help; errors are one line, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.cli import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"ppd {command}" in capsys.readouterr().out


def test_no_command_prints_the_list_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_errors_are_one_line_without_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", "show", str(tmp_path / "missing.csv")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ppd table: error: ") and "not found" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_debug_shows_the_exception(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        main(["--debug", "table", "show", str(tmp_path / "missing.csv")])


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
